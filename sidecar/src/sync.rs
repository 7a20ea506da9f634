//! `skewgate sync`: poll every apiserver's discovery, keep the routing table Envoy runs current.
//!
//! One sync = fetch all apiservers concurrently → remember each one's last good documents
//! (kept for the grace period after a failure, then dropped: the apiserver stays in the table
//! serving nothing) → build the table (`core::build`) → push it (`push`, ordered and confirmed).
//! The loop is a library so that tests and the harness run it in-process.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use skewgate_core::build::BuildError;
use skewgate_core::table::TableConfig;
use tokio::net::TcpListener;
use tokio::sync::{oneshot, watch};
use tokio::time::{Instant, MissedTickBehavior};

use crate::admin::HttpAdmin;
use crate::envoy::UpstreamTls;
use crate::fetch::{ClientTls, Documents, ErrorKind, FetchError, Fetcher};
use crate::push::{PushError, PushOutcome, Pusher, Step};
use crate::routing::{self, Counts, RenderError, Server};
use crate::serve::{self, Shared};

pub use crate::config::SyncConfig;

/// Where an apiserver's contribution to the table stands after a sync.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standing {
    /// Answered this time.
    Current,
    /// Failed; its last good documents, this old, still count (grace period; for as long as it
    /// is over a `[limits]` bound, since it still answers).
    Stale { age: Duration },
    /// Failed past its grace period this time: its GVRs just left the table.
    Dropped,
    /// Failed, with nothing (left) to fall back on: it serves nothing in the table.
    Missing,
}

impl Standing {
    pub fn serves(self) -> bool {
        matches!(self, Standing::Current | Standing::Stale { .. })
    }
}

#[derive(Debug, Clone)]
pub struct ApiserverReport {
    pub id: String,
    pub version: String,
    pub standing: Standing,
    /// This sync's failure, if it failed.
    pub error: Option<FetchError>,
    pub legacy: bool,
}

#[derive(Debug, Clone)]
pub struct SyncReport {
    pub generation: String,
    /// Whether Envoy's files changed.
    pub changed: bool,
    pub steps: Vec<Step>,
    pub counts: Counts,
    pub apiservers: Vec<ApiserverReport>,
    pub took: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    #[error("no apiserver has discovery documents; the table Envoy has stays")]
    NoDocuments,
    #[error("cannot build the table: {0}")]
    Build(#[from] BuildError),
    #[error("refusing to write the table: {0}")]
    Render(#[from] RenderError),
    #[error("push failed: {0}")]
    Push(#[from] PushError),
}

impl SyncError {
    pub fn label(&self) -> &'static str {
        match self {
            SyncError::NoDocuments => "no_documents",
            SyncError::Build(BuildError::Table(e)) | SyncError::Render(RenderError::Invalid(e))
                if e.over_limit =>
            {
                "table_limit"
            }
            SyncError::Build(_) => "build",
            SyncError::Render(RenderError::Invalid(_)) => "invalid_table",
            SyncError::Render(_) => "render",
            SyncError::Push(e) => e.label(),
        }
    }
}

/// What is remembered of one apiserver between syncs.
#[derive(Debug, Default)]
struct Memory {
    good: Option<(Documents, Instant)>,
    failing: bool,
}

impl Memory {
    fn record(
        &mut self,
        id: &str,
        result: Result<Documents, FetchError>,
        now: Instant,
        grace: Duration,
    ) -> Standing {
        match result {
            Ok(documents) => {
                if self.failing {
                    tracing::info!(apiserver = id, "discovery answers again");
                }
                self.failing = false;
                self.good = Some((documents, now));
                Standing::Current
            }
            Err(error) => {
                // Over a limit, the apiserver still answers: its last good documents stay until it
                // is back under the limit, whatever the grace period (meant for silence) says.
                let answering = error.kind == ErrorKind::Limit;
                match (self.failing, self.good.is_some()) {
                    (false, true) if answering => tracing::warn!(
                        apiserver = id,
                        %error,
                        "discovery over a limit; its last good documents stay in the table"
                    ),
                    (false, true) => tracing::warn!(
                        apiserver = id,
                        %error,
                        "discovery failed; its last good documents count for the grace period"
                    ),
                    (false, false) => {
                        tracing::warn!(apiserver = id, %error, "discovery failed; it serves nothing in the table")
                    }
                    (true, _) => tracing::debug!(apiserver = id, %error, "discovery still failing"),
                }
                self.failing = true;
                match &self.good {
                    Some((_, at)) if answering || now.duration_since(*at) <= grace => {
                        Standing::Stale { age: now.duration_since(*at) }
                    }
                    Some((_, at)) => {
                        tracing::warn!(
                            apiserver = id,
                            failing_for_ms = now.duration_since(*at).as_millis() as u64,
                            "grace period over: its GVRs leave the table"
                        );
                        self.good = None;
                        Standing::Dropped
                    }
                    None => Standing::Missing,
                }
            }
        }
    }
}

/// The sync state: clients, memory, the pusher and what `/metrics` reports.
pub struct Sidecar {
    config: SyncConfig,
    fetchers: Vec<Fetcher>,
    memory: Vec<Memory>,
    pusher: Pusher<HttpAdmin>,
    upstream: UpstreamTls,
    shared: Arc<Shared>,
}

impl Sidecar {
    pub fn new(config: SyncConfig) -> anyhow::Result<Self> {
        let tls = ClientTls::load(&config.tls)?;
        let fetchers = config
            .apiservers
            .iter()
            .map(|e| Fetcher::new(e, &config.server_name, &tls, &config.identity, config.limits))
            .collect::<Result<Vec<_>, _>>()?;
        let admin = match &config.envoy.admin_url {
            Some(url) => Some(HttpAdmin::new(url, config.envoy.confirm_timeout)?),
            None => None,
        };
        let pusher = Pusher::new(
            config.envoy.cds_path(),
            config.envoy.ecds_path(),
            admin,
            config.envoy.confirm_timeout,
            config.envoy.settle_delay,
        );
        let path = |p: &std::path::Path| p.display().to_string();
        let upstream = UpstreamTls {
            peer_ca: path(&config.tls.peer_ca),
            client_cert: path(&config.tls.client_cert),
            client_key: path(&config.tls.client_key),
            server_name: config.server_name.clone(),
            health_user: config.identity.user.clone(),
            health_groups: config.identity.groups.clone(),
        };
        let memory = config.apiservers.iter().map(|_| Memory::default()).collect();
        Ok(Self { config, fetchers, memory, pusher, upstream, shared: Arc::new(Shared::default()) })
    }

    pub fn shared(&self) -> Arc<Shared> {
        self.shared.clone()
    }

    /// Fetches every apiserver concurrently and updates what is remembered of each.
    pub async fn collect(&mut self) -> Vec<ApiserverReport> {
        let mut tasks = tokio::task::JoinSet::new();
        for (index, fetcher) in self.fetchers.iter().enumerate() {
            let fetcher = fetcher.clone();
            tasks.spawn(async move { (index, fetcher.fetch().await) });
        }
        let mut results: Vec<Option<Result<Documents, FetchError>>> =
            self.fetchers.iter().map(|_| None).collect();
        while let Some(joined) = tasks.join_next().await {
            match joined {
                Ok((index, result)) => {
                    if let Some(slot) = results.get_mut(index) {
                        *slot = Some(result);
                    }
                }
                Err(e) => tracing::error!(error = %e, "fetch task failed"),
            }
        }
        let now = Instant::now();
        let metrics = &self.shared.metrics;
        let mut reports = Vec::with_capacity(results.len());
        for ((endpoint, memory), result) in self.config.apiservers.iter().zip(&mut self.memory).zip(results) {
            let id = endpoint.id.as_str();
            let result = result.unwrap_or_else(|| {
                Err(FetchError {
                    path: "/".into(),
                    kind: crate::fetch::ErrorKind::Request,
                    detail: "task lost".into(),
                })
            });
            let error = result.as_ref().err().cloned();
            if let Some(e) = &error {
                metrics.fetch_error(id, e.kind.label());
            }
            let standing = memory.record(id, result, now, self.config.grace_period);
            if standing == Standing::Dropped {
                metrics.dropped(id);
            }
            metrics.set_current(id, standing == Standing::Current);
            let (version, legacy) =
                memory.good.as_ref().map(|(d, _)| (d.version.clone(), d.legacy)).unwrap_or_default();
            reports.push(ApiserverReport { id: id.to_owned(), version, standing, error, legacy });
        }
        reports
    }

    /// The table from what is remembered now.
    pub fn table(&self) -> Result<TableConfig, SyncError> {
        if self.memory.iter().all(|m| m.good.is_none()) {
            // Nothing to go on: a table where nobody serves anything would only route
            // everything to the pool, which Envoy's current table does at least as well.
            return Err(SyncError::NoDocuments);
        }
        let servers: Vec<Server<'_>> = self
            .config
            .apiservers
            .iter()
            .zip(&self.memory)
            .map(|(e, m)| Server {
                id: &e.id,
                version: m.good.as_ref().map_or("", |(d, _)| d.version.as_str()),
                documents: m.good.as_ref().map(|(d, _)| [&d.core, &d.apis]),
            })
            .collect();
        Ok(routing::build(&servers)?)
    }

    /// One sync: fetch, build, push. Errors are logged and counted here too.
    pub async fn sync(&mut self) -> Result<SyncReport, SyncError> {
        let started = Instant::now();
        let apiservers = self.collect().await;
        let result = self.build_and_push().await;
        let took = started.elapsed();
        let metrics = &self.shared.metrics;
        metrics.sync_duration.observe(took.as_secs_f64());
        match result {
            Ok((table, outcome)) => {
                let counts = routing::counts(&table);
                metrics.gvrs.set(counts.gvrs as i64);
                metrics.rerouted_gvrs.set(counts.rerouted as i64);
                metrics.succeeded(std::time::Instant::now());
                self.shared.ready.store(true, std::sync::atomic::Ordering::SeqCst);
                let (changed, steps) = match outcome {
                    PushOutcome::Unchanged => (false, Vec::new()),
                    PushOutcome::Pushed { added, removed, steps } => {
                        metrics.table_pushes.inc();
                        tracing::info!(
                            generation = %table.generation,
                            gvrs = counts.gvrs,
                            rerouted = counts.rerouted,
                            added = ?added,
                            removed = ?removed,
                            took_ms = took.as_millis() as u64,
                            "table pushed"
                        );
                        (true, steps)
                    }
                };
                Ok(SyncReport { generation: table.generation, changed, steps, counts, apiservers, took })
            }
            Err(error) => {
                metrics.push_error(error.label());
                tracing::error!(%error, "sync failed");
                Err(error)
            }
        }
    }

    async fn build_and_push(&self) -> Result<(TableConfig, PushOutcome), SyncError> {
        let table = self.table()?;
        let resources = routing::render(
            &table,
            &self.config.apiservers,
            &self.upstream,
            self.config.health,
            &self.config.envoy.wasm,
        )?;
        let outcome = self.pusher.push(&resources).await?;
        Ok((table, outcome))
    }
}

/// One sync and done (`skewgate sync --once`). Without memory of earlier syncs, an apiserver
/// that fails now serves nothing in the table.
pub async fn sync_once(config: SyncConfig) -> anyhow::Result<SyncReport> {
    let mut sidecar = Sidecar::new(config)?;
    Ok(sidecar.sync().await?)
}

/// Fetches once and builds the table without writing anything (`skewgate table --config`).
pub async fn fetch_table(config: SyncConfig) -> anyhow::Result<(TableConfig, Vec<ApiserverReport>)> {
    let mut sidecar = Sidecar::new(config)?;
    let reports = sidecar.collect().await;
    Ok((sidecar.table()?, reports))
}

/// Runs the sidecar until `shutdown` completes: the HTTP endpoints and a sync every poll period.
pub async fn run(config: SyncConfig, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
    let listener =
        TcpListener::bind(config.listen).await.with_context(|| format!("listening on {}", config.listen))?;
    let (reports, _) = watch::channel(None);
    run_with(config, listener, shutdown, reports).await
}

/// A sidecar running in a task, for tests and the harness.
pub struct Running {
    /// Where `/healthz`, `/readyz` and `/metrics` answer.
    pub listen: SocketAddr,
    /// The latest successful sync's report (`None` before the first).
    pub reports: watch::Receiver<Option<Arc<SyncReport>>>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
}

impl Running {
    /// Stops the loop and waits for it.
    pub async fn stop(mut self) -> anyhow::Result<()> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        match self.task.take() {
            Some(task) => task.await.context("sidecar task")?,
            None => Ok(()),
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

/// Starts the sidecar in a task; `config.listen` may use port 0.
pub async fn spawn(config: SyncConfig) -> anyhow::Result<Running> {
    let listener =
        TcpListener::bind(config.listen).await.with_context(|| format!("listening on {}", config.listen))?;
    let listen = listener.local_addr()?;
    let (tx, reports) = watch::channel(None);
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(run_with(
        config,
        listener,
        async {
            let _ = stopped.await;
        },
        tx,
    ));
    Ok(Running { listen, reports, stop: Some(stop), task: Some(task) })
}

async fn run_with(
    config: SyncConfig,
    listener: TcpListener,
    shutdown: impl Future<Output = ()>,
    reports: watch::Sender<Option<Arc<SyncReport>>>,
) -> anyhow::Result<()> {
    let poll_period = config.poll_period;
    let mut sidecar = Sidecar::new(config)?;
    tracing::info!(
        listen = %listener.local_addr()?,
        apiservers = sidecar.config.apiservers.len(),
        poll_period = %crate::duration::format(poll_period),
        grace_period = %crate::duration::format(sidecar.config.grace_period),
        "skewgate sync started"
    );
    let (stop_server, server_stopped) = oneshot::channel::<()>();
    // Aborted if this future is dropped (a `Running` dropped, i.e. the sidecar killed): a
    // detached server task would keep the port and answer /metrics for a dead sidecar.
    let mut server = AbortOnDrop(tokio::spawn(serve::serve(listener, sidecar.shared(), async {
        let _ = server_stopped.await;
    })));
    tokio::pin!(shutdown);
    let mut ticker = tokio::time::interval(poll_period);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            _ = ticker.tick() => {}
        }
        let result = tokio::select! {
            () = &mut shutdown => break,
            result = sidecar.sync() => result,
        };
        if let Ok(report) = result {
            reports.send_replace(Some(Arc::new(report)));
        }
    }
    let _ = stop_server.send(());
    let _ = (&mut server.0).await;
    tracing::info!("skewgate sync stopped");
    Ok(())
}

/// A task that ends with its owner.
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use skewgate_core::discovery::ApiGroupDiscoveryList;
    use skewgate_core::table::TableError;

    fn docs() -> Documents {
        Documents {
            version: "v1.33.0".into(),
            core: ApiGroupDiscoveryList::v2(Vec::new()),
            apis: ApiGroupDiscoveryList::v2(Vec::new()),
            legacy: false,
        }
    }

    fn failure() -> Result<Documents, FetchError> {
        Err(FetchError { path: "/apis".into(), kind: ErrorKind::Timeout, detail: "x".into() })
    }

    #[test]
    fn grace_period_then_drop_then_back() {
        let grace = Duration::from_secs(10);
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut m = Memory::default();
        assert_eq!(m.record("a", failure(), at(0), grace), Standing::Missing);
        assert_eq!(m.record("a", Ok(docs()), at(1), grace), Standing::Current);
        assert_eq!(m.record("a", failure(), at(5), grace), Standing::Stale { age: Duration::from_secs(4) });
        assert!(m.good.is_some());
        assert_eq!(m.record("a", failure(), at(11), grace), Standing::Stale { age: Duration::from_secs(10) });
        assert_eq!(m.record("a", failure(), at(12), grace), Standing::Dropped);
        assert!(m.good.is_none());
        assert_eq!(m.record("a", failure(), at(13), grace), Standing::Missing);
        assert_eq!(m.record("a", Ok(docs()), at(14), grace), Standing::Current);
        assert!(!m.failing);
        let zero = Duration::ZERO;
        assert_eq!(m.record("a", failure(), at(15), zero), Standing::Dropped);
    }

    /// An apiserver over a limit keeps its last good documents past the grace period; once it
    /// stops answering, the grace period counts from those documents again.
    #[test]
    fn over_a_limit_the_last_good_documents_stay() {
        let grace = Duration::from_secs(10);
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let over = || Err(FetchError { path: "/apis".into(), kind: ErrorKind::Limit, detail: "x".into() });
        let mut m = Memory::default();
        assert_eq!(m.record("a", over(), at(0), grace), Standing::Missing);
        assert_eq!(m.record("a", Ok(docs()), at(1), grace), Standing::Current);
        assert_eq!(m.record("a", over(), at(5), grace), Standing::Stale { age: Duration::from_secs(4) });
        assert_eq!(m.record("a", over(), at(100), grace), Standing::Stale { age: Duration::from_secs(99) });
        assert!(m.good.is_some());
        assert_eq!(m.record("a", failure(), at(101), grace), Standing::Dropped);
        assert_eq!(m.record("a", Ok(docs()), at(102), grace), Standing::Current);
    }

    #[test]
    fn error_labels() {
        assert_eq!(SyncError::NoDocuments.label(), "no_documents");
        let table = |over_limit| TableError { field: "groupVersions".into(), reason: "x".into(), over_limit };
        assert_eq!(SyncError::Render(RenderError::Invalid(table(true))).label(), "table_limit");
        assert_eq!(SyncError::Build(BuildError::Table(table(true))).label(), "table_limit");
        assert_eq!(SyncError::Render(RenderError::Invalid(table(false))).label(), "invalid_table");
        assert!(Standing::Stale { age: Duration::ZERO }.serves() && !Standing::Dropped.serves());
    }
}
