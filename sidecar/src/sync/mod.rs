//! `skewgate sync`: keeps the routing table Envoy runs, and which apiservers Envoy may send new
//! requests to, current with every apiserver's discovery.
//!
//! Two kinds of look, each remembered per apiserver:
//! - every poll period, a full fetch of every apiserver's discovery;
//! - every probe period, a probe of each apiserver on its own, over a connection kept open to it
//!   ([`crate::tether`]): `/readyz`, and `/api` + `/apis` with the ETags of its last good
//!   documents (304: unchanged). One that changed is fetched at once and the new table pushed at
//!   once, without waiting for the next poll; one whose connection closes (its process stopped)
//!   counts as unreachable from that moment.
//!
//! An apiserver's last good documents stay until it answers with others or leaves the
//! configuration: one that stops answering keeps its GVRs in the table, where Envoy finds no
//! healthy host for those only it serves and the filter answers 503 — never a timer that would
//! turn that into a 404 from the others.
//!
//! Eligibility ([`crate::eligibility`]): from the first look that finds an apiserver unreachable,
//! unready or changed, its endpoints are marked `DRAINING` in every Envoy cluster (an overlay on
//! `cds.json`, [`crate::envoy::push`]) until a table built from its current discovery is live. A table
//! is pushed by a task of its own, so that probes go on (and can take an apiserver out) while
//! Envoy confirms a push.
//!
//! When this process is down, Envoy keeps the last table and the last overlay: eligibility holds
//! as it was, and Envoy's own `/readyz` checks go on. The last good documents are saved next to
//! Envoy's files (`state/discovery.json`), so that a restarted sidecar keeps an unreachable
//! apiserver's GVRs in the table too. The library runs in-process in tests and the harness.
//!
//! The loop ([`run`]) is a reconciler around a scheduler: each event (a poll tick, a fetch, probe,
//! look at the cluster or push that ended) is first recorded in the memory, then handed to the
//! [`schedule::Scheduler`], which holds every rule of when to fetch, ask, save and push and
//! answers with commands; the executor ([`execute`]) carries them out over its `Io` (the network
//! and Envoy, or a test's fakes) and hands back the next event.

use std::collections::{BTreeMap, VecDeque};
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use skewgate_core::build::{BuildError, ClusterNames, ServerApis, build_table_with};
use skewgate_core::table::{Counts, TableConfig};
use tokio::net::TcpListener;
use tokio::sync::{oneshot, watch};
use tokio::time::{Instant, MissedTickBehavior};

use crate::eligibility::{self, Exclusion, Live, Now, Served};
use crate::envoy::{HttpAdmin, PushError, PushOutcome, Pusher, Step};
use crate::fetch::{ClientTls, Documents, FetchError, Fetcher};
use crate::peers::{self, Asker, Published, Source};
use crate::serve::{self, Shared};
use crate::tether::{self, Readiness, Tether};
use execute::{AbortOnDrop, Executor, Tethered};
use memory::Memory;
use schedule::{Event, Scheduler};
use skewgate_core::extensions::Extensions;
use skewgate_envoy::{Endpoint, Overlay, RenderError, Resources, UpstreamTls, table_from_ecds, write_atomic};

pub use crate::config::SyncConfig;

mod execute;
mod memory;
pub mod schedule;

/// Where an apiserver's contribution to the table stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standing {
    /// Its latest look answered.
    Current,
    /// Its latest look failed; its last good documents, this old, still count.
    Stale { age: Duration },
    /// Never answered (in this process): it serves nothing in the table.
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
    /// The latest look's failure, if it failed.
    pub error: Option<FetchError>,
    pub legacy: bool,
    /// Why Envoy may not send it new requests (`None`: it may, or nothing is known yet).
    pub excluded: Option<Exclusion>,
    /// What its `/readyz` said at the latest probe.
    pub readiness: Option<Readiness>,
    /// Where it came from ([`crate::peers`]).
    pub source: Source,
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

impl SyncReport {
    /// What `skewgate sync --once` prints and the sidecar's `/status` answers.
    pub fn to_json(&self) -> serde_json::Value {
        let apiservers: Vec<serde_json::Value> = self
            .apiservers
            .iter()
            .map(|a| {
                let (standing, stale_seconds) = match a.standing {
                    Standing::Current => ("current", None),
                    Standing::Stale { age } => ("stale", Some(age.as_secs())),
                    Standing::Missing => ("missing", None),
                };
                serde_json::json!({
                    "id": a.id,
                    "version": a.version,
                    "standing": standing,
                    "staleSeconds": stale_seconds,
                    "legacy": a.legacy,
                    "source": a.source.to_string(),
                    "excluded": a.excluded.map(Exclusion::label),
                    "readiness": a.readiness.map(Readiness::label),
                    "error": a.error.as_ref().map(ToString::to_string),
                    "errorKind": a.error.as_ref().map(|e| e.kind.label()),
                })
            })
            .collect();
        serde_json::json!({
            "generation": self.generation,
            "changed": self.changed,
            "steps": self.steps.iter().map(ToString::to_string).collect::<Vec<_>>(),
            "gvrs": self.counts.gvrs,
            "reroutedGvrs": self.counts.rerouted,
            "tookMs": self.took.as_millis() as u64,
            "apiservers": apiservers,
        })
    }
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

/// What one probe of one apiserver found.
#[derive(Debug, Clone)]
pub enum Look {
    /// Ready or not, still serving the documents it was asked about.
    Unchanged {
        ready: Readiness,
    },
    /// No ETags to ask with (legacy discovery): only readiness is known.
    Ready {
        ready: Readiness,
    },
    /// Its documents changed, and this is what a fetch found then.
    Changed {
        ready: Readiness,
        fetched: Box<Result<Documents, FetchError>>,
    },
    Failed(FetchError),
}

/// The sync state: clients, memory, the pusher, what Envoy runs, and what `/metrics` reports.
pub struct Sidecar {
    config: SyncConfig,
    /// The apiservers followed, configured ones first, then those that joined, in order.
    members: Vec<Member>,
    pusher: Pusher<HttpAdmin>,
    upstream: UpstreamTls,
    shared: Arc<Shared>,
    /// The table Envoy runs as far as this process knows: the one in `ecds.json` at start, then
    /// every one pushed.
    live: Option<Live>,
    /// Tables handed to a push that no later push confirmed: the one under way, and those of
    /// pushes that failed. Envoy may run any of them (a push that fails after writing the routes
    /// or the table leaves Envoy on either side of it), so each is judged as `live` is.
    unconfirmed: Vec<Live>,
    /// A full fetch has been recorded: before it, too little is known to judge anyone, and the
    /// overlay on disk stands.
    judged: bool,
    /// Asks the cluster for its apiservers and extensions (`None`: static, no extensions).
    asker: Option<Asker>,
    extensions: Extensions,
    /// For the clients of apiservers that join.
    tls: ClientTls,
    tether_tls: Arc<rustls::ClientConfig>,
}

/// One apiserver the sidecar follows: where it is, its clients, what is remembered of it, and
/// the task that probes it while the loop runs (gone with the member).
struct Member {
    endpoint: Endpoint,
    fetcher: Fetcher,
    tether: Tether,
    memory: Memory,
    tethered: Option<Tethered>,
}

impl Sidecar {
    pub fn new(config: SyncConfig) -> anyhow::Result<Self> {
        for d in &config.deprecations {
            tracing::warn!(field = %d.field, "{}", d.reason);
        }
        let tls = ClientTls::load(&config.tls)?;
        let tether_tls = tether::tls_config(&config.tls)?;
        let asker = config.cluster.asks().then(|| Asker::new(&config, tls.clone()));
        let admin = match &config.envoy.admin_url {
            Some(url) => Some(HttpAdmin::new(url, config.envoy.confirm_timeout)?),
            None => None,
        };
        let files = config.envoy.files();
        let pusher = Pusher::new(&files, admin, config.envoy.confirm_timeout, config.envoy.settle_delay);
        let pusher = match config.envoy.native_module {
            true => pusher.with_native_module(&files),
            false => pusher,
        };
        let path = |p: &std::path::Path| p.display().to_string();
        let upstream = UpstreamTls {
            peer_ca: path(&config.tls.peer_ca),
            client_cert: path(&config.tls.client_cert),
            client_key: path(&config.tls.client_key),
            server_name: config.server_name.clone(),
            health_user: config.identity.user.clone(),
            health_groups: config.identity.groups.clone(),
        };
        let started = Instant::now();
        let draining = pusher.adopt_draining_from_disk().unwrap_or_default();
        let mut saved = load_saved(&config);
        let members = config
            .apiservers
            .iter()
            .map(|e| {
                let excluded = draining.draining.contains(&e.id) || draining.stopping.contains(&e.id);
                // Until a look says otherwise, what the previous sidecar last saw of it.
                let good = saved.remove(&e.id).map(|d| {
                    let served = Served::of(&d);
                    (d, served, started)
                });
                Ok(Member {
                    endpoint: e.clone(),
                    fetcher: Fetcher::new(e, &config.server_name, &tls, &config.identity, config.limits)?,
                    tether: Tether::new(e, &config.server_name, tether_tls.clone(), &config.identity)?,
                    memory: Memory { good, excluded_since: excluded.then_some(started), ..Memory::default() },
                    tethered: None,
                })
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        let live = std::fs::read(config.envoy.files().ecds_path())
            .ok()
            .and_then(|bytes| serde_json::from_slice::<serde_json::Value>(&bytes).ok())
            .and_then(|ecds| serde_json::from_str::<TableConfig>(table_from_ecds(&ecds)?).ok())
            .map(Live::of);
        Ok(Self {
            config,
            members,
            pusher,
            upstream,
            shared: Arc::new(Shared::default()),
            live,
            unconfirmed: Vec::new(),
            judged: false,
            asker,
            extensions: Extensions::default(),
            tls,
            tether_tls,
        })
    }

    /// Every tether asks with its member's current ETags from its next probe on.
    fn ask_with_current_etags(&self) {
        for member in &self.members {
            if let Some(tethered) = &member.tethered {
                tethered.ask_with(member.memory.etags());
            }
        }
    }

    /// The current members' endpoints.
    pub fn endpoints(&self) -> Vec<Endpoint> {
        self.members.iter().map(|m| m.endpoint.clone()).collect()
    }

    /// Every member's fetcher, with its id, in order.
    fn fetchers(&self) -> Vec<(String, Fetcher)> {
        self.members.iter().map(|m| (m.endpoint.id.clone(), m.fetcher.clone())).collect()
    }

    /// The fetchers a look at the cluster asks, in order (none when it asks nothing).
    fn cluster_candidates(&mut self) -> Option<(crate::cluster::ClusterConfig, Vec<Endpoint>, Vec<Fetcher>)> {
        let members = self.endpoints();
        let asker = self.asker.as_mut()?;
        Some((asker.config(), asker.configured(), asker.candidates(&members)))
    }

    /// Takes in what a look at the cluster found: members join (not yet in the table) or are
    /// marked departed, departed ones leave after `leaveAfter`, extensions are replaced.
    /// Returns the ids that joined and left, and whether the table must be rebuilt.
    fn apply_published(&mut self, published: Published) -> (Vec<String>, Vec<String>, bool) {
        let now = Instant::now();
        let mut changed = false;
        if let Some(extensions) = published.extensions {
            if extensions != self.extensions {
                tracing::info!(
                    extensions = ?extensions.iter().map(|(g, v)| format!("{g}/{v}")).collect::<Vec<_>>(),
                    "CRD- and APIService-backed group/versions changed"
                );
                self.extensions = extensions;
                changed = true;
            }
        }
        let mut joined = Vec::new();
        // A listing that names no apiserver is not believed: the one answering is one.
        if let Some(members) = published.members.filter(|m| !m.is_empty()) {
            for member in &members {
                match self.members.iter_mut().find(|m| m.endpoint.id == member.endpoint.id) {
                    Some(known) if known.endpoint == member.endpoint => {
                        let memory = &mut known.memory;
                        memory.source = member.source;
                        if memory.departed_since.take().is_some() {
                            tracing::info!(apiserver = %member.endpoint.id, "published again");
                            changed = true;
                        }
                    }
                    Some(_) => tracing::warn!(
                        apiserver = %member.endpoint.id,
                        "published with another address than the member of that id; ignored"
                    ),
                    None => match self.add_member(member) {
                        Ok(()) => joined.push(member.endpoint.id.clone()),
                        Err(error) => {
                            tracing::warn!(apiserver = %member.endpoint.id, %error, "cannot add it")
                        }
                    },
                }
            }
            for Member { endpoint, memory, .. } in &mut self.members {
                let published = members.iter().any(|m| m.endpoint.id == endpoint.id);
                if !published && memory.departed_since.is_none() {
                    tracing::info!(apiserver = %endpoint.id, "no longer published by the cluster: DRAINING");
                    memory.departed_since = Some(now);
                    changed = true;
                }
            }
        }
        let leave_after = self.config.cluster.leave_after;
        let mut left = Vec::new();
        // Never in the look that found it gone: it is DRAINING for one poll at least.
        let gone = |m: &Member| {
            m.memory.departed_since.is_some_and(|at| at < now && now.duration_since(at) >= leave_after)
        };
        while let Some(i) = self.members.iter().position(gone) {
            let Member { endpoint, .. } = self.members.remove(i);
            tracing::info!(apiserver = %endpoint.id, "left");
            left.push(endpoint.id);
            changed = true;
        }
        if !joined.is_empty() {
            tracing::info!(apiservers = ?joined, "joined; they enter the table once their discovery answers");
        }
        (joined, left, changed)
    }

    /// The apiservers the OpenAPI composer reads, in the configured order.
    fn openapi_members(&self) -> Vec<(String, Fetcher)> {
        self.fetchers()
    }

    fn add_member(&mut self, member: &peers::Member) -> anyhow::Result<()> {
        if self.members.len() >= skewgate_core::table::MAX_APISERVERS {
            anyhow::bail!("already {} apiservers", skewgate_core::table::MAX_APISERVERS);
        }
        let c = &self.config;
        let fetcher = Fetcher::new(&member.endpoint, &c.server_name, &self.tls, &c.identity, c.limits)?;
        let tether = Tether::new(&member.endpoint, &c.server_name, self.tether_tls.clone(), &c.identity)?;
        self.members.push(Member {
            endpoint: member.endpoint.clone(),
            fetcher,
            tether,
            memory: Memory { source: member.source, joined: true, ..Memory::default() },
            tethered: None,
        });
        Ok(())
    }

    /// One look at the cluster, taken in at once (`sync --once`, `table --config`).
    async fn ask_cluster(&mut self) {
        let Some((config, configured, candidates)) = self.cluster_candidates() else { return };
        match peers::look(config, &configured, &candidates).await {
            Ok(published) => {
                self.apply_published(published);
            }
            Err(error) => tracing::warn!(%error, "cannot ask the cluster; what is known stays"),
        }
    }

    pub fn shared(&self) -> Arc<Shared> {
        self.shared.clone()
    }

    /// Saves every apiserver's last good documents for the next sidecar (see the module doc).
    fn save(&self) {
        let saved: BTreeMap<&str, &Documents> = self
            .members
            .iter()
            .filter_map(|m| m.memory.good.as_ref().map(|(d, _, _)| (m.endpoint.id.as_str(), d)))
            .collect();
        let path = saved_path(&self.config);
        let written = serde_json::to_vec(&saved).map_err(std::io::Error::other).and_then(|bytes| {
            std::fs::create_dir_all(path.parent().unwrap_or(&self.config.envoy.dir))?;
            write_atomic(&path, &bytes)
        });
        if let Err(error) = written {
            tracing::warn!(path = %path.display(), %error, "cannot save the apiservers' last good discovery");
        }
    }

    /// Fetches every apiserver concurrently and updates what is remembered of each.
    pub async fn collect(&mut self) -> Vec<ApiserverReport> {
        self.ask_cluster().await;
        let started = Instant::now();
        let results = execute::fetch_all(self.fetchers()).await;
        self.record_fetches(started, results);
        self.reports()
    }

    /// Returns whether some apiserver's documents changed. Results of members that left since
    /// the fetch started are dropped; one that joined since has none this time.
    fn record_fetches(&mut self, started: Instant, results: Vec<Fetched>) -> bool {
        let now = Instant::now();
        let metrics = &self.shared.metrics;
        let mut changed = false;
        for (id, result) in results {
            let Some(Member { endpoint, memory, .. }) = self.members.iter_mut().find(|m| m.endpoint.id == id)
            else {
                continue;
            };
            let id = endpoint.id.as_str();
            if let Err(e) = &result {
                metrics.fetch_error(id, e.kind.label());
            }
            match (memory.newer(started), result) {
                (true, Ok(documents)) => changed |= memory.answered(id, documents, now),
                (true, Err(error)) => memory.failed(id, error),
                (false, Ok(documents)) => changed |= memory.fill(documents, now),
                (false, Err(_)) => {}
            }
            metrics.set_current(id, memory.standing(now) == Standing::Current);
        }
        self.judged = true;
        changed
    }

    /// Returns whether the apiserver's documents changed.
    fn record_look(&mut self, id: &str, started: Instant, look: Look) -> bool {
        let now = Instant::now();
        // A look of a member that has left since.
        let Some(Member { endpoint, memory, .. }) = self.members.iter_mut().find(|m| m.endpoint.id == id)
        else {
            return false;
        };
        let id = endpoint.id.as_str();
        // Probe failures are not fetches: an apiserver that is down would count four times a
        // second. Its exclusion (`reason="unreachable"`) and the next full fetch show it.
        if let Look::Changed { fetched, .. } = &look {
            if let Err(e) = fetched.as_ref() {
                self.shared.metrics.fetch_error(id, e.kind.label());
            }
        }
        // Readiness carries no discovery: the latest answer counts, whenever its probe started.
        if let Look::Ready { ready } = look {
            memory.readiness(id, ready);
            return false;
        }
        if !memory.newer(started) {
            return match look {
                Look::Changed { fetched, .. } => match *fetched {
                    Ok(documents) => memory.fill(documents, now),
                    Err(_) => false,
                },
                _ => false,
            };
        }
        let changed = match look {
            Look::Unchanged { ready } => {
                memory.readiness(id, ready);
                memory.unchanged(id);
                false
            }
            Look::Ready { .. } => false,
            Look::Changed { ready, fetched } => {
                memory.readiness(id, ready);
                match *fetched {
                    Ok(documents) => {
                        let changed = memory.answered(id, documents, now);
                        if changed {
                            tracing::info!(apiserver = id, "discovery changed");
                        }
                        changed
                    }
                    Err(error) => {
                        memory.failed(id, error);
                        false
                    }
                }
            }
            Look::Failed(error) => {
                memory.failed(id, error);
                false
            }
        };
        self.shared.metrics.set_current(id, memory.standing(now) == Standing::Current);
        changed
    }

    fn reports(&self) -> Vec<ApiserverReport> {
        let now = Instant::now();
        self.members
            .iter()
            .map(|Member { endpoint, memory: m, .. }| {
                let (version, legacy) =
                    m.good.as_ref().map(|(d, _, _)| (d.version.clone(), d.legacy)).unwrap_or_default();
                ApiserverReport {
                    id: endpoint.id.clone(),
                    version,
                    standing: m.standing(now),
                    error: m.error.clone(),
                    legacy,
                    excluded: m.excluded,
                    readiness: m.ready,
                    source: m.source,
                }
            })
            .collect()
    }

    /// The table from what is remembered now.
    pub fn table(&self) -> Result<TableConfig, SyncError> {
        if self.members.iter().all(|m| m.memory.good.is_none()) {
            // Nothing to go on: a table where nobody serves anything would only route
            // everything to the pool, which Envoy's current table does at least as well.
            return Err(SyncError::NoDocuments);
        }
        let servers: Vec<ServerApis<'_>> = self
            .members
            .iter()
            .map(|m| (&m.endpoint, &m.memory))
            // One that joined enters the table with its discovery, not before.
            .filter(|(_, m)| !(m.joined && m.good.is_none()))
            .map(|(e, m)| ServerApis {
                id: &e.id,
                version: m.good.as_ref().map_or("", |(d, _, _)| d.version.as_str()),
                documents: m.good.as_ref().map(|(d, _, _)| vec![&d.core, &d.apis]).unwrap_or_default(),
                legacy: m.good.as_ref().and_then(|(d, _, _)| d.legacy_documents.as_ref()),
                features: m.good.as_ref().map(|(d, _, _)| &d.features),
            })
            .collect();
        let mut table = build_table_with(&servers, &ClusterNames::default(), &self.extensions)?;
        table.policy.hold = self.config.hold;
        Ok(table)
    }

    fn prepare(&self) -> Result<Resources, SyncError> {
        let mut table = self.table()?;
        table.openapi_cluster = Some(crate::openapi::CLUSTER.into());
        let socket = self.config.envoy.dir.join(crate::openapi::SOCKET);
        let resources = skewgate_envoy::render(
            &mut table,
            &self.endpoints(),
            &self.upstream,
            self.config.health,
            &self.config.envoy.wasm,
            self.config.envoy.route_timeout,
            |cds| crate::openapi::add_cluster(cds, &socket),
        )?;
        Ok(resources)
    }

    /// A push is about to be handed `table`: from now on Envoy may run it, and the apiservers
    /// are judged against it too, before the push writes anything.
    fn handing_over(&mut self, table: &TableConfig) {
        let known = |l: &Live| l.table.generation == table.generation;
        if !self.live.as_ref().is_some_and(known) && !self.unconfirmed.iter().any(known) {
            self.unconfirmed.push(Live::of(table.clone()));
        }
        self.apply_eligibility();
    }

    /// Marks `DRAINING` in `cds.json` exactly the apiservers that must not get new requests
    /// now, judged against every table Envoy may run.
    pub fn apply_eligibility(&mut self) {
        if !self.judged {
            return;
        }
        let tables: Vec<&Live> = self.live.iter().chain(&self.unconfirmed).collect();
        if tables.is_empty() {
            return;
        }
        let now: Vec<Now<'_>> = self
            .members
            .iter()
            .map(|m| (&m.endpoint, &m.memory))
            .map(|(e, m)| Now {
                id: &e.id,
                served: m.good.as_ref().map(|(_, s, _)| s),
                reachable: m.reachable,
                ready: m.ready,
            })
            .collect();
        let mut verdicts = eligibility::verdicts_against(&tables, &now);
        for (verdict, member) in verdicts.iter_mut().zip(&self.members) {
            if member.memory.departed_since.is_some() {
                *verdict = Some(Exclusion::Departed);
            }
        }
        let mut overlay = Overlay::default();
        for (member, verdict) in self.members.iter().zip(&verdicts) {
            let id = member.endpoint.id.clone();
            match verdict {
                Some(Exclusion::Stopping) => overlay.stopping.insert(id),
                Some(_) => overlay.draining.insert(id),
                None => false,
            };
        }
        if let Err(error) = self.pusher.set_draining(&overlay) {
            // The overlay on disk is unchanged; the next look tries again.
            self.shared.metrics.push_error(error.label());
            tracing::error!(%error, "cannot mark apiservers DRAINING in cds.json");
            return;
        }
        let at = Instant::now();
        let metrics = &self.shared.metrics;
        for (Member { endpoint, memory, .. }, verdict) in self.members.iter_mut().zip(verdicts) {
            let id = endpoint.id.as_str();
            metrics.set_eligible(id, verdict.is_none());
            match (verdict, memory.excluded_since) {
                (Some(reason), None) => {
                    tracing::info!(apiserver = id, %reason, "out of every Envoy cluster (DRAINING)");
                    metrics.excluded(id, reason.label());
                    memory.excluded_since = Some(at);
                }
                (None, Some(since)) => {
                    let out = at.duration_since(since);
                    tracing::info!(apiserver = id, out_ms = out.as_millis() as u64, "eligible again");
                    metrics.apiserver_excluded.observe(out.as_secs_f64());
                    memory.excluded_since = None;
                }
                _ => {}
            }
            memory.excluded = verdict;
        }
    }

    /// Records a push's result: the new live table, metrics, the report.
    fn pushed(
        &mut self,
        table: TableConfig,
        result: Result<PushOutcome, PushError>,
        started: Instant,
    ) -> Result<SyncReport, SyncError> {
        let took = started.elapsed();
        let metrics = &self.shared.metrics;
        metrics.sync_duration.observe(took.as_secs_f64());
        let outcome = match result {
            Ok(outcome) => outcome,
            Err(error) => {
                // The table stays among the unconfirmed ones: its files may be live.
                let error = SyncError::from(error);
                metrics.push_error(error.label());
                tracing::error!(%error, "sync failed");
                return Err(error);
            }
        };
        let counts = table.counts();
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
        let generation = table.generation.clone();
        self.live = Some(Live::of(table));
        self.unconfirmed.clear();
        self.apply_eligibility();
        let report = SyncReport { generation, changed, steps, counts, apiservers: self.reports(), took };
        self.shared.set_status(&report.to_json());
        Ok(report)
    }

    /// One sync: fetch, judge against the live table, build, push, judge against the new one.
    pub async fn sync(&mut self) -> Result<SyncReport, SyncError> {
        let started = Instant::now();
        self.collect().await;
        self.save();
        self.apply_eligibility();
        let resources = match self.prepare() {
            Ok(prepared) => prepared,
            Err(error) => {
                self.shared.metrics.push_error(error.label());
                tracing::error!(%error, "sync failed");
                return Err(error);
            }
        };
        self.handing_over(&resources.table);
        let result = self.pusher.push(&resources).await;
        self.pushed(resources.table, result, started)
    }
}

fn saved_path(config: &SyncConfig) -> std::path::PathBuf {
    config.envoy.dir.join("state").join("discovery.json")
}

/// What a previous sidecar saved; nothing when there is no file or it does not parse.
fn load_saved(config: &SyncConfig) -> BTreeMap<String, Documents> {
    let path = saved_path(config);
    let Ok(bytes) = std::fs::read(&path) else { return BTreeMap::new() };
    match serde_json::from_slice(&bytes) {
        Ok(saved) => saved,
        Err(error) => {
            tracing::warn!(path = %path.display(), %error, "ignoring the saved discovery");
            BTreeMap::new()
        }
    }
}

/// One member's fetch: its id and what came of it.
pub type Fetched = (String, Result<Documents, FetchError>);

/// One sync and done (`skewgate sync --once`). An apiserver that fails now keeps the last good
/// discovery a previous sidecar saved of it; without one it serves nothing in the table.
pub async fn sync_once(config: SyncConfig) -> anyhow::Result<SyncReport> {
    Ok(sync_once_with_table(config).await?.0)
}

/// [`sync_once`], with the table it handed to Envoy.
pub async fn sync_once_with_table(config: SyncConfig) -> anyhow::Result<(SyncReport, TableConfig)> {
    let mut sidecar = Sidecar::new(config)?;
    let report = sidecar.sync().await?;
    let table = sidecar.live.take().map(|live| live.table).context("a sync that succeeded left no table")?;
    Ok((report, table))
}

/// Fetches once and builds the table without writing anything (`skewgate table --config`).
pub async fn fetch_table(config: SyncConfig) -> anyhow::Result<(TableConfig, Vec<ApiserverReport>)> {
    let mut sidecar = Sidecar::new(config)?;
    let reports = sidecar.collect().await;
    // As it would be written: sealed with its clusters, the generation Envoy would show.
    let table = sidecar.prepare()?.table;
    Ok((table, reports))
}

/// Runs the sidecar until `shutdown` completes: the HTTP endpoints, a full sync every poll
/// period and a probe of each apiserver every probe period.
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
    /// The latest successful push's report (`None` before the first).
    pub reports: watch::Receiver<Option<Arc<SyncReport>>>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
}

impl Running {
    /// Why the loop ended, once it has ended on its own (it runs until stopped otherwise): a
    /// sidecar that cannot start (say, its OpenAPI socket's path is too long) says so here
    /// rather than leaving its caller waiting for `/readyz`.
    pub async fn exit_error(&mut self) -> Option<anyhow::Error> {
        if !self.task.as_ref().is_some_and(tokio::task::JoinHandle::is_finished) {
            return None;
        }
        match self.task.take()?.await {
            Ok(Ok(())) => Some(anyhow::anyhow!("the sidecar stopped")),
            Ok(Err(error)) => Some(error),
            Err(error) => Some(anyhow::Error::new(error).context("sidecar task")),
        }
    }

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
    let (poll_period, probe_period) = (config.poll_period, config.probe_period);
    let probe_timeout = tether::probe_timeout(config.health.timeout_ms);
    let mut sidecar = Sidecar::new(config)?;
    tracing::info!(
        listen = %listener.local_addr()?,
        apiservers = sidecar.members.len(),
        poll_period = %skewgate_core::duration::format(poll_period),
        probe_period = %skewgate_core::duration::format(probe_period),
        "skewgate sync started"
    );
    let (stop_server, server_stopped) = oneshot::channel::<()>();
    // Aborted if this future is dropped (a `Running` dropped, i.e. the sidecar killed): a
    // detached server task would keep the port and answer /metrics for a dead sidecar.
    let mut server = AbortOnDrop(tokio::spawn(serve::serve(listener, sidecar.shared(), async {
        let _ = server_stopped.await;
    })));
    // The OpenAPI composer: its own loop and socket, so that a slow or huge document never holds
    // a table change back. Aborted with this future.
    let (openapi_members, members) = watch::channel(sidecar.openapi_members());
    // Bound here, before the first push has created Envoy's directory: a composer that cannot
    // bind would leave every OpenAPI request at the edge a 503 while the sidecar reported ready.
    let socket = sidecar.config.envoy.dir.join(crate::openapi::SOCKET);
    let openapi_listener = std::fs::create_dir_all(&sidecar.config.envoy.dir)
        .and_then(|()| crate::openapi::serve::bind(&socket))
        .with_context(|| format!("cannot serve OpenAPI on {}", socket.display()))?;
    let _openapi = AbortOnDrop(tokio::spawn(crate::openapi::serve::run(
        sidecar.shared(),
        members,
        openapi_listener,
        socket,
        poll_period,
        std::future::pending(),
    )));
    // Puts back Envoy's files when someone else changes them: Envoy acts on any that parses.
    let _guard = AbortOnDrop(tokio::spawn(crate::guard::run(sidecar.pusher.clone(), sidecar.shared())));
    tokio::pin!(shutdown);
    let mut poll = tokio::time::interval(poll_period);
    poll.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut scheduler = Scheduler::new(schedule::Cluster {
        asks: sidecar.asker.is_some(),
        lists_extensions: sidecar.config.cluster.extensions,
    });
    let network = execute::Network { probe_period, probe_timeout };
    let mut executor = Executor::new(network, openapi_members, reports);
    let members = sidecar.members.iter().map(|m| m.endpoint.id.clone()).collect();
    let mut pending = VecDeque::from([Event::Started { members }]);
    loop {
        // What an event changed in the memory decides who may get new requests, and what the
        // tethers ask with, before the commands it leads to (a push among them) run.
        sidecar.ask_with_current_etags();
        sidecar.apply_eligibility();
        while let Some(event) = pending.pop_front() {
            for command in scheduler.on(Instant::now(), event) {
                executor.carry_out(&mut sidecar, command, &mut pending);
            }
        }
        let event = tokio::select! {
            () = &mut shutdown => break,
            _ = poll.tick() => Event::Poll,
            event = executor.next(&mut sidecar) => event,
        };
        pending.push_back(event);
    }
    let _ = stop_server.send(());
    let _ = (&mut server.0).await;
    tracing::info!("skewgate sync stopped");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::memory::tests::docs;
    use super::*;
    use skewgate_core::table::TableError;

    #[test]
    fn error_labels() {
        assert_eq!(SyncError::NoDocuments.label(), "no_documents");
        let table = |over_limit| TableError { field: "groupVersions".into(), reason: "x".into(), over_limit };
        assert_eq!(SyncError::Render(RenderError::Invalid(table(true))).label(), "table_limit");
        assert_eq!(SyncError::Build(BuildError::Table(table(true))).label(), "table_limit");
        assert_eq!(SyncError::Render(RenderError::Invalid(table(false))).label(), "invalid_table");
        assert!(Standing::Stale { age: Duration::ZERO }.serves() && !Standing::Missing.serves());
    }

    use crate::testing::published as member;

    /// d joins (out of the table until its discovery answers), then departs: DRAINING for one
    /// look, gone at the next (`leaveAfter = 0s`); a listing naming nobody changes nothing.
    #[test]
    fn members_join_then_depart_then_leave() {
        let certs = crate::testing::Certs::new("members");
        let config = certs.following_cluster(7001, true);
        let mut sidecar = Sidecar::new(config).unwrap();
        sidecar.members[0].memory.good = Some((docs("v1.33.0"), Served::default(), Instant::now()));
        let published = |members: Vec<peers::Member>| Published { members: Some(members), extensions: None };

        let (joined, left, _) =
            sidecar.apply_published(published(vec![member("a", 7001), member("d", 7004)]));
        assert_eq!((joined, left), (vec!["d".to_string()], Vec::<String>::new()));
        assert_eq!(
            sidecar.reports().iter().map(|r| r.source).collect::<Vec<_>>(),
            [Source::EndpointSlice; 2]
        );
        let ids = |t: &TableConfig| t.apiservers.iter().map(|a| a.id.clone()).collect::<Vec<_>>();
        assert_eq!(ids(&sidecar.table().unwrap()), ["a"], "not before its discovery answered");
        sidecar.members[1].memory.good = Some((docs("v1.36.0"), Served::default(), Instant::now()));
        assert_eq!(ids(&sidecar.table().unwrap()), ["a", "d"]);

        let (_, _, changed) = sidecar.apply_published(published(Vec::new()));
        assert!(!changed, "a listing naming nobody is not believed");
        let (_, left, changed) = sidecar.apply_published(published(vec![member("a", 7001)]));
        assert!(changed && left.is_empty(), "DRAINING first");
        assert!(sidecar.members[1].memory.departed_since.is_some());
        let (_, left, _) = sidecar.apply_published(published(vec![member("a", 7001)]));
        assert_eq!(left, ["d"]);
        assert_eq!(sidecar.endpoints().iter().map(|e| e.id.as_str()).collect::<Vec<_>>(), ["a"]);
        // A fetch that started before d left: its answer for d goes nowhere, a's goes to a.
        let results = vec![("d".to_owned(), Ok(docs("v1.36.0"))), ("a".to_owned(), Ok(docs("v1.34.0")))];
        sidecar.record_fetches(Instant::now(), results);
        let versions: Vec<(String, String)> =
            sidecar.reports().into_iter().map(|r| (r.id, r.version)).collect();
        assert_eq!(versions, [("a".to_owned(), "v1.34.0".to_owned())]);

        let extensions = Extensions::new([("example.com".to_owned(), "v1".to_owned())]);
        let (_, _, changed) =
            sidecar.apply_published(Published { members: None, extensions: Some(extensions.clone()) });
        assert!(changed && sidecar.extensions == extensions);
        let _ = std::fs::remove_dir_all(&certs.dir);
    }
}
