//! Handing a table to Envoy through its watched files, in the one order that never leaves a
//! request routed to a cluster Envoy does not have (docs/architecture.md, "Discovery path"):
//!
//! 1. `cds.json` with the union of the clusters on disk and the new ones; wait until Envoy has
//!    all new clusters (and the ones the new table starts routing to have a healthy host);
//! 2. `rds.json` with the routes of the new table, when they changed; wait until Envoy runs them;
//! 3. `ecds.json` with the new table; wait until the filter runs it (with the native module,
//!    its `module/ecds.json` first, carrying the same table: both name the clusters of step 1);
//! 4. `cds.json` with exactly the new clusters, dropping those nothing references any more.
//!
//! The routes go before the table: their bypass routes only take requests the new table sends
//! to the pool, with no header the filter would change (core/src/bypass.rs proves it), and the
//! pool is in every `cds.json`. Meanwhile the filter, on the old table, decides every other
//! request as it did. The other way round, the old bypass would keep taking requests for a
//! group/version the new table no longer finds uniform past the moment the filter stopped
//! sending them to the pool.
//!
//! Files are only written when their content changes, always with temp file + fsync + rename.
//! The state is read back from disk on every push, so that a push interrupted by an error (or
//! a restart) resumes where it stopped. Without an admin API each wait is a fixed settle delay.
//!
//! Which apiservers Envoy may send new requests to (eligibility) is an overlay on every
//! `cds.json` written: their endpoints are marked `DRAINING` ([`super::with_draining`]). It lies
//! over every `rds.json` too: the bypass routes of an API's only apiserver are there while it is
//! up and leave with it ([`skewgate_envoy::rds_with_overlay`]), so that its requests meet the
//! filter, which holds them while it is away. The overlay changes on its own
//! ([`Pusher::set_draining`]), also while a push is under way: every `cds.json` and `rds.json`
//! write holds one lock and applies the overlay of that moment, so that the two never undo each
//! other; a push confirms its routes by the rendering's version, under whatever overlay. The
//! clusters of apiservers' addresses take their endpoints from files of their own
//! ([`skewgate_envoy::eds`]), written before `cds.json`: a change of the overlay alone rewrites
//! only those, and Envoy rebuilds no cluster for it.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use serde_json::Value;
use tokio::time::Instant;

use super::admin::{AdminError, EnvoyAdmin, LiveTable};
use skewgate_envoy::eds::{self, OnDisk};
use skewgate_envoy::{
    Files, Overlay, Resources, cluster_names, draining_in, module_ecds, rds_version, rds_with_overlay,
    routes_base_version, table_from_ecds, union_cds, with_draining, write_atomic,
};

/// How often the admin API is asked while waiting.
const CONFIRM_POLL: Duration = Duration::from_millis(50);

/// What a push did, step by step (for logs and tests).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// `cds.json` written with these clusters.
    WroteCds(Vec<String>),
    /// `rds.json` written with the routes of this version.
    WroteRds(String),
    /// Envoy runs the routes of this version.
    RoutesLive(String),
    /// Envoy has every cluster of the new CDS.
    ClustersPresent,
    /// Not every newly routed-to cluster had a healthy host in time; the table went out anyway.
    ClustersUnhealthy(Vec<String>),
    WroteEcds(String),
    /// The native module's `module/ecds.json` written with the table of this generation.
    WroteModuleEcds(String),
    /// The filter runs the table of this generation.
    TableLive(String),
    /// No admin API: waited the settle delay.
    Settled,
}

impl std::fmt::Display for Step {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Step::WroteCds(clusters) => write!(f, "wrote cds.json ({} clusters)", clusters.len()),
            Step::WroteRds(version) => write!(f, "wrote rds.json {version}"),
            Step::RoutesLive(version) => write!(f, "routes {version} live"),
            Step::ClustersPresent => f.write_str("every cluster present"),
            Step::ClustersUnhealthy(clusters) => {
                write!(f, "no healthy host in time: {}", clusters.join(", "))
            }
            Step::WroteEcds(generation) => write!(f, "wrote ecds.json {generation}"),
            Step::WroteModuleEcds(generation) => write!(f, "wrote module/ecds.json {generation}"),
            Step::TableLive(generation) => write!(f, "table {generation} live"),
            Step::Settled => f.write_str("waited the settle delay (no admin API)"),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PushOutcome {
    /// Both files already hold this content.
    Unchanged,
    Pushed {
        added: Vec<String>,
        removed: Vec<String>,
        steps: Vec<Step>,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum PushError {
    #[error("{path}: {error}")]
    Io { path: PathBuf, error: std::io::Error },
    #[error(transparent)]
    Admin(#[from] AdminError),
    #[error("Envoy does not have clusters {missing:?} after {timeout:?}; table not written")]
    ClustersMissing { missing: Vec<String>, timeout: Duration },
    #[error("Envoy rejected table {generation} (update_rejected went up); the previous table still serves")]
    TableRejected { generation: String },
    #[error("table {generation} not live after {timeout:?} (Envoy runs {live:?})")]
    TableNotLive { generation: String, live: Option<String>, timeout: Duration },
    #[error(
        "Envoy rejected rds.json {version} (update_rejected went up; its log says why); the \
         previous routes still serve and the table was not written"
    )]
    RoutesRejected { version: String },
    #[error("routes {version} not live after {timeout:?} (Envoy runs {live:?}); the table was not written")]
    RoutesNotLive { version: String, live: Option<String>, timeout: Duration },
}

impl PushError {
    /// The `kind` label of the push error counter.
    pub fn label(&self) -> &'static str {
        match self {
            PushError::Io { .. } => "io",
            PushError::Admin(_) => "admin",
            PushError::ClustersMissing { .. } => "clusters_missing",
            PushError::TableRejected { .. } => "table_rejected",
            PushError::TableNotLive { .. } => "table_not_live",
            PushError::RoutesRejected { .. } => "routes_rejected",
            PushError::RoutesNotLive { .. } => "routes_not_live",
        }
    }
}

/// Writes `cds.json`, `rds.json` and `ecds.json`, confirming each step with `A`. Clones share
/// the eligibility overlay.
#[derive(Debug, Clone)]
pub struct Pusher<A> {
    cds_path: PathBuf,
    /// Where the endpoints of the clusters of apiservers' addresses live.
    eds_dir: PathBuf,
    /// `None` with the native module: bootstrap-native.yaml keeps its routes static.
    rds_path: Option<PathBuf>,
    ecds_path: PathBuf,
    /// The native module's ECDS file, when the sidecar serves the module too.
    module_path: Option<PathBuf>,
    admin: Option<A>,
    confirm_timeout: Duration,
    settle_delay: Duration,
    /// The overlay of every `cds.json` and `rds.json` written, with the routes it lies over; the
    /// lock of every write of either.
    draining: Arc<Mutex<Laid>>,
    /// What this sidecar last wrote to each file, for [`Pusher::restore_replaced_files`]; the
    /// lock of every file write.
    written: Arc<Mutex<Written>>,
    /// The last push failed: the files may be ahead of what Envoy runs, so files that already
    /// hold a table do not say it is live.
    in_doubt: Arc<AtomicBool>,
}

/// The eligibility overlay, and the routes (as rendered) of the last `rds.json` written under it.
#[derive(Debug, Default)]
struct Laid {
    overlay: Overlay,
    routes: Option<Value>,
}

/// The files as this sidecar wrote them.
#[derive(Debug, Default)]
pub(crate) struct Written {
    pub(crate) files: std::collections::BTreeMap<PathBuf, (Arc<[u8]>, Option<Stamp>)>,
    /// Counts every write: a check that saw the same count twice saw no write in between.
    pub(crate) writes: u64,
}

/// Enough of a file's metadata to notice that it was replaced or edited since.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stamp {
    ino: u64,
    len: u64,
    modified: Option<std::time::SystemTime>,
}

impl Stamp {
    fn of(path: &Path) -> Option<Self> {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(path).ok()?;
        Some(Self { ino: m.ino(), len: m.len(), modified: m.modified().ok() })
    }
}

impl<A: EnvoyAdmin> Pusher<A> {
    pub fn new(files: &Files, admin: Option<A>, confirm_timeout: Duration, settle_delay: Duration) -> Self {
        Self {
            cds_path: files.cds_path(),
            eds_dir: files.eds_dir(),
            rds_path: Some(files.rds_path()),
            ecds_path: files.ecds_path(),
            module_path: None,
            admin,
            confirm_timeout,
            settle_delay,
            draining: Arc::default(),
            written: Arc::default(),
            in_doubt: Arc::default(),
        }
    }

    /// Also writes the native module's ECDS file of `files` (docs/native-module.md), with each
    /// table, just before the filter's.
    /// The module's bootstrap (bootstrap-native.yaml) keeps its routes static: no `rds.json`.
    pub fn with_native_module(mut self, files: &Files) -> Self {
        self.module_path = Some(files.module_ecds_path());
        self.rds_path = None;
        self
    }

    /// The routes' file for `resources` under the overlay of this moment, when there is one to
    /// write, with its path.
    fn rds_file(&self, resources: &Resources) -> Option<(&Path, Vec<u8>)> {
        let laid = self.draining.lock().unwrap_or_else(PoisonError::into_inner);
        self.rds_path
            .as_deref()
            .map(|path| (path, to_bytes(&rds_with_overlay(&resources.rds, &laid.overlay))))
    }

    /// Writes `routes` (as rendered) under the overlay of this moment, unless the file already
    /// holds them (then [`Pusher::adopt`]s it); the overlay lies over them from now on.
    fn write_routes(&self, path: &Path, routes: &Value) -> Result<(), PushError> {
        let mut laid = self.draining.lock().unwrap_or_else(PoisonError::into_inner);
        let bytes = to_bytes(&rds_with_overlay(routes, &laid.overlay));
        match self.ours(path)?.as_deref() == Some(&bytes[..]) {
            true => self.adopt(path, &bytes),
            false => self.write(path, &bytes)?,
        }
        laid.routes = Some(routes.clone());
        Ok(())
    }

    /// The module's file for `resources`, when there is one to write, with its path.
    fn module_file(&self, resources: &Resources) -> Option<(&Path, Vec<u8>)> {
        let path = self.module_path.as_deref()?;
        table_from_ecds(&resources.ecds).map(|table| (path, to_bytes(&module_ecds(table))))
    }

    /// Takes over the overlay of the `cds.json` on disk without writing anything: a restarted
    /// sidecar keeps what the previous one decided until it knows better.
    pub fn adopt_draining_from_disk(&self) -> Result<Overlay, PushError> {
        let mut laid = self.draining.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(cds) = self.joined(read_optional)? {
            laid.overlay = draining_in(&cds);
        }
        Ok(laid.overlay.clone())
    }

    pub fn draining(&self) -> Overlay {
        self.draining.lock().unwrap_or_else(PoisonError::into_inner).overlay.clone()
    }

    /// Lays exactly `draining` over the `cds.json` on disk (if there is one) and the routes last
    /// written, now. Returns whether the overlay changed.
    pub fn set_draining(&self, draining: &Overlay) -> Result<bool, PushError> {
        let mut laid = self.draining.lock().unwrap_or_else(PoisonError::into_inner);
        if laid.overlay == *draining {
            return Ok(false);
        }
        let routes = match (&self.rds_path, &laid.routes) {
            (Some(path), Some(routes)) => Some((path, to_bytes(&rds_with_overlay(routes, draining)))),
            _ => None,
        };
        let routes = match routes {
            Some((path, bytes)) if self.ours(path)?.as_deref() != Some(&bytes[..]) => Some((path, bytes)),
            _ => None,
        };
        // An apiserver's routes leave before it leaves the clusters, and come back after it is
        // back: in between, its requests meet the filter, which sends them to it (or holds
        // them) rather than a route sending them to a cluster that has nobody for them.
        let leaving = !draining.away().is_subset(&laid.overlay.away());
        if leaving && let Some((path, bytes)) = &routes {
            self.write(path, bytes)?;
        }
        // A `cds.json` that does not parse is left for the next push to replace.
        if let Some(cds) = self.joined(|path| self.ours(path))? {
            self.write_on_disk(&self.on_disk(&cds, draining))?;
        }
        if !leaving && let Some((path, bytes)) = &routes {
            self.write(path, bytes)?;
        }
        laid.overlay = draining.clone();
        Ok(true)
    }

    /// Writes `cds` (endpoints inline) with the overlay of this moment.
    fn write_cds(&self, cds: &Value) -> Result<(), PushError> {
        let laid = self.draining.lock().unwrap_or_else(PoisonError::into_inner);
        self.write_on_disk(&self.on_disk(cds, &laid.overlay))
    }

    /// The files for `cds` (endpoints inline) with the overlay of this moment.
    fn overlaid(&self, cds: &Value) -> OnDisk {
        let laid = self.draining.lock().unwrap_or_else(PoisonError::into_inner);
        self.on_disk(cds, &laid.overlay)
    }

    fn on_disk(&self, cds: &Value, draining: &Overlay) -> OnDisk {
        eds::split(&with_draining(cds, draining), &self.eds_dir)
    }

    /// Whether the files, as this sidecar last wrote them, hold `cds` with the overlay of this
    /// moment.
    fn cds_current(&self, cds: &Value) -> Result<bool, PushError> {
        let disk = self.overlaid(cds);
        for (path, file) in &disk.eds {
            if self.ours(path)?.as_deref() != Some(&to_bytes(file)[..]) {
                return Ok(false);
            }
        }
        Ok(self.ours(&self.cds_path)?.as_deref() == Some(&to_bytes(&disk.cds)[..]))
    }

    /// The clusters of `cds.json` with their endpoints inline, every file read with `read`;
    /// `None` without a `cds.json` that parses.
    fn joined(
        &self,
        read: impl Fn(&Path) -> Result<Option<Vec<u8>>, PushError>,
    ) -> Result<Option<Value>, PushError> {
        let Some(cds) = read(&self.cds_path)?.and_then(|b| serde_json::from_slice::<Value>(&b).ok()) else {
            return Ok(None);
        };
        let mut failed = None;
        let joined = eds::join(&cds, |path| match read(path) {
            Ok(bytes) => bytes.and_then(|b| serde_json::from_slice(&b).ok()),
            Err(error) => {
                failed.get_or_insert(error);
                None
            }
        });
        match failed {
            Some(error) => Err(error),
            None => Ok(Some(joined)),
        }
    }

    /// Writes each file of `disk` that changed, the endpoints before the clusters that read
    /// them, then removes the endpoint files of clusters `cds.json` no longer has (Envoy reads an
    /// endpoint file on a rename into place only: a removal changes nothing for it).
    fn write_on_disk(&self, disk: &OnDisk) -> Result<(), PushError> {
        std::fs::create_dir_all(&self.eds_dir)
            .map_err(|error| PushError::Io { path: self.eds_dir.clone(), error })?;
        for (path, file) in &disk.eds {
            let bytes = to_bytes(file);
            if self.ours(path)?.as_deref() != Some(&bytes[..]) {
                self.write(path, &bytes)?;
            }
        }
        let bytes = to_bytes(&disk.cds);
        if self.ours(&self.cds_path)?.as_deref() != Some(&bytes[..]) {
            self.write(&self.cds_path, &bytes)?;
        }
        let kept: BTreeSet<&Path> = disk.eds.iter().map(|(path, _)| path.as_path()).collect();
        let entries = match std::fs::read_dir(&self.eds_dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(error) => return Err(PushError::Io { path: self.eds_dir.clone(), error }),
        };
        let mut written = self.written.lock().unwrap_or_else(PoisonError::into_inner);
        for entry in entries.flatten() {
            let path = entry.path();
            let is_file = path.extension().is_some_and(|e| e == "json");
            if is_file && !kept.contains(path.as_path()) {
                match std::fs::remove_file(&path) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(error) => return Err(PushError::Io { path, error }),
                }
                written.files.remove(&path);
            }
        }
        Ok(())
    }

    pub async fn push(&self, resources: &Resources) -> Result<PushOutcome, PushError> {
        let result = self.push_in_order(resources).await;
        self.in_doubt.store(result.is_err(), Ordering::SeqCst);
        result
    }

    /// Whether Envoy runs `resources`' table and routes; without an admin API nothing says
    /// otherwise.
    async fn runs(&self, resources: &Resources, routes: Option<&str>) -> Result<bool, PushError> {
        let Some(admin) = &self.admin else { return Ok(true) };
        let table = admin.live_table().await?.map(|t| t.generation);
        let routes_live = match routes {
            Some(version) => admin.live_routes().await?.as_deref().map(routes_base_version) == Some(version),
            None => true,
        };
        Ok(routes_live && table.as_deref() == Some(resources.generation.as_str()))
    }

    async fn push_in_order(&self, resources: &Resources) -> Result<PushOutcome, PushError> {
        let rds = self.rds_file(resources);
        let routes_version = rds_version(&resources.rds).unwrap_or_default().to_owned();
        let new_ecds = to_bytes(&resources.ecds);
        let cds_current = self.cds_current(&resources.cds)?;
        let disk_ecds = self.ours(&self.ecds_path)?;
        let module = self.module_file(resources);
        let module_current = match &module {
            Some((path, new)) => self.ours(path)?.as_deref() == Some(&new[..]),
            None => true,
        };
        let rds_current = match &rds {
            Some((path, new)) => self.ours(path)?.as_deref() == Some(&new[..]),
            None => true,
        };
        let files_current =
            cds_current && rds_current && disk_ecds.as_deref() == Some(&new_ecds[..]) && module_current;
        // After a failed push, files that hold the table may not be what Envoy runs (it rejected
        // them, or was too slow to confirm): then the steps below wait until it does.
        if files_current
            && (!self.in_doubt.load(Ordering::SeqCst)
                || self.runs(resources, rds.as_ref().map(|_| routes_version.as_str())).await?)
        {
            // Written by an earlier process: guarded from now on as if this one had written them.
            self.adopt_all(resources, rds.as_ref(), module.as_ref())?;
            return Ok(PushOutcome::Unchanged);
        }
        for dir in self.dirs() {
            std::fs::create_dir_all(dir).map_err(|error| PushError::Io { path: dir.to_path_buf(), error })?;
        }
        let old_cds = self.joined(|path| self.ours(path))?;
        let old_names = cluster_names(old_cds.as_ref());
        let new_names = cluster_names(Some(&resources.cds));
        let added: Vec<String> = new_names.difference(&old_names).cloned().collect();
        let removed: Vec<String> = old_names.difference(&new_names).cloned().collect();
        let mut steps = Vec::new();

        if disk_ecds.is_none() {
            // Envoy refuses to start without the ECDS file, so none runs on these files yet:
            // nothing to order against. Clusters first all the same, for one starting meanwhile.
            self.write_cds(&resources.cds)?;
            steps.push(Step::WroteCds(new_names.into_iter().collect()));
            if let Some((path, _)) = &rds {
                self.write_routes(path, &resources.rds)?;
                steps.push(Step::WroteRds(routes_version));
            }
            if let Some((path, new)) = &module {
                self.write(path, new)?;
                steps.push(Step::WroteModuleEcds(resources.generation.clone()));
            }
            self.write(&self.ecds_path, &new_ecds)?;
            steps.push(Step::WroteEcds(resources.generation.clone()));
            return Ok(PushOutcome::Pushed { added, removed, steps });
        }

        let live = match &self.admin {
            Some(admin) => admin.live_table().await?,
            None => None,
        };
        let live_routes = match (&self.admin, &rds) {
            (Some(admin), Some(_)) => admin.live_routes().await?,
            _ => None,
        };
        let table_pending = disk_ecds.as_deref() != Some(&new_ecds[..])
            || !module_current
            || self.admin.is_some() && live.as_ref().map(|l| &l.generation) != Some(&resources.generation);
        let routes_pending = !rds_current
            || rds.is_some()
                && self.admin.is_some()
                && live_routes.as_deref().map(routes_base_version) != Some(routes_version.as_str());
        if table_pending || routes_pending {
            let union = union_cds(&resources.cds, old_cds.as_ref());
            if !self.cds_current(&union)? {
                self.write_cds(&union)?;
                steps.push(Step::WroteCds(cluster_names(Some(&union)).into_iter().collect()));
            }
            let live_clusters = live.map(|l| l.clusters).unwrap_or_default();
            let routed = LiveTable::of(&resources.table).clusters;
            // A set only streaming lists go to is not waited for: a streaming list that meets it
            // before its first health check waits in the hold for that check, and the table that
            // moves everything else must not.
            let serving: BTreeSet<Vec<String>> = resources.table.serving_sets().into_iter().collect();
            let streaming_only: BTreeSet<&String> = resources
                .table
                .sets
                .iter()
                .filter(|s| !serving.contains(&s.members))
                .map(|s| &s.cluster)
                .collect();
            let newly_routed: BTreeSet<String> = routed
                .difference(&live_clusters)
                .filter(|c| {
                    !streaming_only.contains(c) && !streaming_only.iter().any(|s| c.ends_with(s.as_str()))
                })
                .cloned()
                .collect();
            self.confirm_clusters(&new_names, &newly_routed, &mut steps).await?;

            if routes_pending {
                let rejections_before = self.rejections(Confirmed::Routes).await?;
                if let Some((path, _)) = rds.as_ref().filter(|_| !rds_current) {
                    self.write_routes(path, &resources.rds)?;
                    steps.push(Step::WroteRds(routes_version.clone()));
                }
                self.confirm(Confirmed::Routes, &routes_version, rejections_before, &mut steps).await?;
            }
        }
        if table_pending {
            let rejections_before = self.rejections(Confirmed::Table).await?;
            if let Some((path, new)) = module.as_ref().filter(|_| !module_current) {
                self.write(path, new)?;
                steps.push(Step::WroteModuleEcds(resources.generation.clone()));
            }
            if disk_ecds.as_deref() != Some(&new_ecds[..]) {
                self.write(&self.ecds_path, &new_ecds)?;
                steps.push(Step::WroteEcds(resources.generation.clone()));
            }
            self.confirm(Confirmed::Table, &resources.generation, rejections_before, &mut steps).await?;
        }

        if !self.cds_current(&resources.cds)? {
            self.write_cds(&resources.cds)?;
            steps.push(Step::WroteCds(new_names.into_iter().collect()));
        }
        // A file this push found already right (written by an earlier process, or by
        // `sync_once` before Envoy started) is guarded from now on as if this one had written
        // it: else a file someone else wrote over it was never put back.
        self.adopt_all(resources, rds.as_ref(), module.as_ref())?;
        Ok(PushOutcome::Pushed { added, removed, steps })
    }

    /// [`Pusher::adopt`] for every file of `resources`; the routes under the overlay of this
    /// moment, which may have moved since the push began.
    fn adopt_all(
        &self,
        resources: &Resources,
        rds: Option<&(&Path, Vec<u8>)>,
        module: Option<&(&Path, Vec<u8>)>,
    ) -> Result<(), PushError> {
        let disk = self.overlaid(&resources.cds);
        for (path, file) in &disk.eds {
            self.adopt(path, &to_bytes(file));
        }
        self.adopt(&self.cds_path, &to_bytes(&disk.cds));
        if let Some((path, _)) = rds {
            self.write_routes(path, &resources.rds)?;
        }
        if let Some((path, new)) = module {
            self.adopt(path, new);
        }
        self.adopt(&self.ecds_path, &to_bytes(&resources.ecds));
        Ok(())
    }

    fn write(&self, path: &Path, bytes: &[u8]) -> Result<(), PushError> {
        let mut written = self.written.lock().unwrap_or_else(PoisonError::into_inner);
        write_atomic(path, bytes).map_err(|error| PushError::Io { path: path.to_path_buf(), error })?;
        written.files.insert(path.to_path_buf(), (Arc::from(bytes), Stamp::of(path)));
        written.writes += 1;
        Ok(())
    }

    /// The file as this process last wrote it, else as it is on disk: a file someone else
    /// wrote meanwhile is never built upon (the guard puts ours back).
    fn ours(&self, path: &Path) -> Result<Option<Vec<u8>>, PushError> {
        let written = self.written.lock().unwrap_or_else(PoisonError::into_inner);
        match written.files.get(path) {
            Some((bytes, _)) => Ok(Some(bytes.to_vec())),
            None => read_optional(path),
        }
    }

    /// Takes a file found on disk with these bytes as written by this process, unless it wrote
    /// one itself: the stamp of whatever is on disk now must never replace the one of its own
    /// write (a file someone else put there meanwhile would then never be put back).
    fn adopt(&self, path: &Path, bytes: &[u8]) {
        let mut written = self.written.lock().unwrap_or_else(PoisonError::into_inner);
        if !written.files.contains_key(path) {
            written.files.insert(path.to_path_buf(), (Arc::from(bytes), Stamp::of(path)));
        }
    }

    /// Puts back at once each of Envoy's files that someone else replaced or
    /// edited since this sidecar wrote it (Envoy acts on any file that parses). Unless `read_all`,
    /// a file is only read when its inode, length or mtime moved: inodes are reused and mtimes
    /// are coarse (a few ms), so a caller reads everything now and then too. Returns the files
    /// put back.
    pub fn restore_replaced_files(&self, read_all: bool) -> Result<Vec<PathBuf>, PushError> {
        let mut written = self.written.lock().unwrap_or_else(PoisonError::into_inner);
        let mut restored = Vec::new();
        let mut rewrites = 0;
        for (path, (bytes, stamp)) in written.files.iter_mut() {
            let now = Stamp::of(path);
            if !read_all && now.is_some() && now == *stamp {
                continue;
            }
            if read_optional(path)?.as_deref() != Some(&bytes[..]) {
                write_atomic(path, bytes).map_err(|error| PushError::Io { path: path.clone(), error })?;
                restored.push(path.clone());
                rewrites += 1;
            }
            *stamp = Stamp::of(path);
        }
        written.writes += rewrites;
        Ok(restored)
    }

    /// Writes each of `paths`, in order, again with the bytes this sidecar last wrote there (a
    /// fresh inode, so Envoy loads it again), if nothing was written since write count `writes`.
    /// Returns the files written.
    pub fn rewrite_if_unchanged_since(
        &self,
        paths: &[&Path],
        writes: u64,
    ) -> Result<Vec<PathBuf>, PushError> {
        let mut written = self.written.lock().unwrap_or_else(PoisonError::into_inner);
        if written.writes != writes {
            return Ok(Vec::new());
        }
        let mut rewritten = Vec::new();
        for path in paths {
            let Some((bytes, _)) = written.files.get(*path).cloned() else { continue };
            write_atomic(path, &bytes).map_err(|error| PushError::Io { path: path.to_path_buf(), error })?;
            written.files.insert(path.to_path_buf(), (bytes, Stamp::of(path)));
            written.writes += 1;
            rewritten.push(path.to_path_buf());
        }
        Ok(rewritten)
    }

    /// What Envoy should be running now by the files this sidecar wrote: the table's generation
    /// and the clusters of `cds.json`, with the write count they go with.
    pub fn expected(&self) -> (u64, Option<String>, BTreeSet<String>) {
        let written = self.written.lock().unwrap_or_else(PoisonError::into_inner);
        let parse = |path: &Path| -> Option<Value> {
            written.files.get(path).and_then(|(b, _)| serde_json::from_slice(b).ok())
        };
        let generation = parse(&self.ecds_path).as_ref().and_then(table_summary_of).map(|t| t.generation);
        let clusters = cluster_names(parse(&self.cds_path).as_ref());
        (written.writes, generation, clusters)
    }

    pub fn cds_path(&self) -> &Path {
        &self.cds_path
    }

    /// Every directory this sidecar writes Envoy's files in.
    pub fn dirs(&self) -> BTreeSet<&Path> {
        [Some(&self.cds_path), self.rds_path.as_ref(), Some(&self.ecds_path), self.module_path.as_ref()]
            .into_iter()
            .flatten()
            .filter_map(|p| p.parent())
            .chain([self.eds_dir.as_path()])
            .collect()
    }

    /// The files that carry the table, in the order a push writes them: the native module's (if
    /// any), then the filter's.
    pub fn table_paths(&self) -> Vec<&Path> {
        self.module_path.iter().map(PathBuf::as_path).chain([self.ecds_path.as_path()]).collect()
    }

    pub fn admin(&self) -> Option<&A> {
        self.admin.as_ref()
    }

    /// The admin API to confirm a step with; without one, the step counts as done once the
    /// settle delay is over (recorded in `steps`).
    async fn admin_or_settle(&self, steps: &mut Vec<Step>) -> Option<&A> {
        if self.admin.is_none() {
            tokio::time::sleep(self.settle_delay).await;
            steps.push(Step::Settled);
        }
        self.admin.as_ref()
    }

    /// Every cluster of the new CDS present (else the table must not go out), and each one the
    /// table newly routes to past its first health check: a cluster Envoy has not checked yet
    /// would answer "no healthy upstream". A cluster whose hosts were checked and failed is not
    /// waited for: that is an apiserver still starting, and the table that routes around what it
    /// stopped serving must not wait for it (meanwhile the pool would already send it requests
    /// for GVRs it dropped, and it would 404 them). Unless one of its hosts is healthy in another
    /// cluster: then the apiserver is up and only this cluster's first check failed (one slower
    /// than the timeout, on a loaded node), and the next will pass. The wait is bounded and only
    /// warned about.
    async fn confirm_clusters(
        &self,
        wanted: &BTreeSet<String>,
        newly_routed: &BTreeSet<String>,
        steps: &mut Vec<Step>,
    ) -> Result<(), PushError> {
        let Some(admin) = self.admin_or_settle(steps).await else { return Ok(()) };
        let deadline = Instant::now() + self.confirm_timeout;
        let mut present = false;
        loop {
            let clusters = admin.clusters().await?;
            let missing: Vec<String> =
                wanted.iter().filter(|n| !clusters.contains_key(*n)).cloned().collect();
            if missing.is_empty() && !present {
                present = true;
                steps.push(Step::ClustersPresent);
            }
            let up_elsewhere: BTreeSet<&str> =
                clusters.values().flat_map(|c| c.healthy.iter().map(String::as_str)).collect();
            let unhealthy: Vec<String> = newly_routed
                .iter()
                .filter(|n| {
                    clusters.get(*n).is_none_or(|c| {
                        c.healthy.is_empty()
                            && (c.pending > 0
                                || c.hosts() == 0
                                || c.failing.iter().any(|h| up_elsewhere.contains(h.as_str())))
                    })
                })
                .cloned()
                .collect();
            if present && unhealthy.is_empty() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                if !present {
                    return Err(PushError::ClustersMissing { missing, timeout: self.confirm_timeout });
                }
                steps.push(Step::ClustersUnhealthy(unhealthy));
                return Ok(());
            }
            tokio::time::sleep(CONFIRM_POLL).await;
        }
    }

    /// `what`'s rejection count now, to tell a rejection of what comes next.
    async fn rejections(&self, what: Confirmed) -> Result<Option<u64>, PushError> {
        Ok(match &self.admin {
            Some(admin) => Some(what.rejections(admin).await?),
            None => None,
        })
    }

    /// Envoy runs `wanted` (the routes' version, the table's generation), else what depends on
    /// it must not go out: a rejected file (a table the filter refuses, a route regex over RE2's
    /// program-size limit) leaves the previous one in place.
    async fn confirm(
        &self,
        what: Confirmed,
        wanted: &str,
        rejections_before: Option<u64>,
        steps: &mut Vec<Step>,
    ) -> Result<(), PushError> {
        let Some(admin) = self.admin_or_settle(steps).await else { return Ok(()) };
        let deadline = Instant::now() + self.confirm_timeout;
        let wanted = wanted.to_owned();
        loop {
            let live = what.live(admin).await?;
            if live.as_deref() == Some(wanted.as_str()) {
                steps.push(match what {
                    Confirmed::Routes => Step::RoutesLive(wanted),
                    Confirmed::Table => Step::TableLive(wanted),
                });
                return Ok(());
            }
            if let Some(before) = rejections_before {
                if what.rejections(admin).await? > before {
                    return Err(match what {
                        Confirmed::Routes => PushError::RoutesRejected { version: wanted },
                        Confirmed::Table => PushError::TableRejected { generation: wanted },
                    });
                }
            }
            if Instant::now() >= deadline {
                let timeout = self.confirm_timeout;
                return Err(match what {
                    Confirmed::Routes => PushError::RoutesNotLive { version: wanted, live, timeout },
                    Confirmed::Table => PushError::TableNotLive { generation: wanted, live, timeout },
                });
            }
            tokio::time::sleep(CONFIRM_POLL).await;
        }
    }
}

/// What a push waits for Envoy to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Confirmed {
    /// `rds.json`, by its version.
    Routes,
    /// The table, by its generation.
    Table,
}

impl Confirmed {
    async fn live<A: EnvoyAdmin>(self, admin: &A) -> Result<Option<String>, AdminError> {
        match self {
            // The rendering's version: the overlay of the moment does not matter.
            Confirmed::Routes => Ok(admin.live_routes().await?.map(|v| routes_base_version(&v).to_owned())),
            Confirmed::Table => Ok(admin.live_table().await?.map(|t| t.generation)),
        }
    }

    async fn rejections<A: EnvoyAdmin>(self, admin: &A) -> Result<u64, AdminError> {
        match self {
            Confirmed::Routes => admin.rds_rejections().await,
            Confirmed::Table => admin.ecds_rejections().await,
        }
    }
}

fn to_bytes(value: &Value) -> Vec<u8> {
    // Serialising a `Value` cannot fail (its keys are strings).
    serde_json::to_vec(value).unwrap_or_default()
}

fn read_optional(path: &Path) -> Result<Option<Vec<u8>>, PushError> {
    match std::fs::read(path) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(error) => Err(PushError::Io { path: path.to_path_buf(), error }),
    }
}

/// The generation and clusters of the table an `ecds.json` this sidecar wrote carries.
fn table_summary_of(ecds: &Value) -> Option<super::admin::LiveTable> {
    super::admin::table_summary(table_from_ecds(ecds)?)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::os::unix::fs::MetadataExt;
    use std::sync::{Arc, Mutex};

    use serde_json::json;
    use skewgate_core::table::{RoutingTable, TableConfig};

    use super::*;
    use crate::envoy::admin::{ClusterHealth, LiveTable, table_summary};
    use skewgate_envoy::{Endpoint, Health, UpstreamTls};

    /// Envoy as far as the pusher can tell: it picks up the files when asked (ECDS before CDS,
    /// the worst order for the pusher), and records every moment its table names a cluster it
    /// does not have.
    #[derive(Default)]
    struct Fake {
        cds: PathBuf,
        rds: PathBuf,
        ecds: PathBuf,
        /// The native module's file, loaded like `ecds` when there is one.
        module: PathBuf,
        cds_loaded: Vec<u8>,
        rds_loaded: Vec<u8>,
        ecds_loaded: Vec<u8>,
        /// The version of the routes it runs, and whether it refuses new ones.
        routes_live: Option<String>,
        reject_routes: bool,
        route_rejections: u64,
        /// The order in which it loaded what (`rds`, `ecds`).
        loads: Vec<&'static str>,
        module_loaded: Vec<u8>,
        clusters: BTreeMap<String, (ClusterHealth, u32)>,
        live: Option<LiveTable>,
        module_live: Option<LiveTable>,
        rejections: u64,
        /// Admin calls before a changed cds.json is noticed.
        cds_lag: u32,
        lag_left: u32,
        /// Admin calls before a new cluster's hosts turn healthy (`u32::MAX`: never).
        healthy_after: u32,
        /// New clusters' hosts come with their first health check done and failed (an
        /// apiserver still starting), instead of pending it.
        checked_unhealthy: bool,
        /// The address of every new cluster's one host (default: one of its own).
        host: Option<String>,
        /// Clusters the live table routed to while they had no healthy host.
        routed_unhealthy: Vec<String>,
        reject: bool,
        calls: u32,
        violations: Vec<String>,
    }

    #[derive(Clone, Default)]
    struct FakeEnvoy(Arc<Mutex<Fake>>);

    impl FakeEnvoy {
        fn new(dir: &Path) -> Self {
            let files = Files::new(dir);
            let fake = Fake {
                cds: files.cds_path(),
                rds: files.rds_path(),
                ecds: files.ecds_path(),
                module: files.module_ecds_path(),
                ..Fake::default()
            };
            Self(Arc::new(Mutex::new(fake)))
        }

        fn with(&self, f: impl FnOnce(&mut Fake)) {
            f(&mut self.0.lock().unwrap());
        }

        fn observe(&self) -> std::sync::MutexGuard<'_, Fake> {
            let mut f = self.0.lock().unwrap();
            f.calls += 1;
            let rds = std::fs::read(&f.rds).unwrap_or_default();
            if rds != f.rds_loaded {
                f.rds_loaded = rds.clone();
                let value: Value = serde_json::from_slice(&rds).unwrap();
                match f.reject_routes {
                    true => f.route_rejections += 1,
                    false => f.routes_live = rds_version(&value).map(str::to_owned),
                }
                f.loads.push("rds");
            }
            let ecds = std::fs::read(&f.ecds).unwrap_or_default();
            if ecds != f.ecds_loaded {
                f.loads.push("ecds");
                f.ecds_loaded = ecds.clone();
                let value: Value = serde_json::from_slice(&ecds).unwrap();
                let summary = table_from_ecds(&value).and_then(table_summary).unwrap();
                if f.reject {
                    f.rejections += 1;
                } else {
                    let unhealthy: Vec<String> = summary
                        .clusters
                        .iter()
                        .filter(|c| f.clusters.get(*c).is_some_and(|(h, _)| h.healthy.is_empty()))
                        .cloned()
                        .collect();
                    f.routed_unhealthy.extend(unhealthy);
                    f.live = Some(summary);
                }
            }
            let module = std::fs::read(&f.module).unwrap_or_default();
            if module != f.module_loaded {
                f.module_loaded = module.clone();
                let value: Value = serde_json::from_slice(&module).unwrap();
                f.module_live = table_from_ecds(&value).and_then(table_summary);
            }
            let cds = std::fs::read(&f.cds).unwrap_or_default();
            if cds != f.cds_loaded {
                if f.lag_left > 0 {
                    f.lag_left -= 1;
                } else {
                    let lag = f.cds_lag;
                    f.lag_left = lag;
                    let value: Value = serde_json::from_slice(&cds).unwrap();
                    let names = cluster_names(Some(&value));
                    f.clusters.retain(|name, _| names.contains(name));
                    let healthy_after = f.healthy_after;
                    for name in names {
                        let host = f.host.clone().unwrap_or_else(|| format!("{name}:6443"));
                        let health = match f.checked_unhealthy {
                            true => ClusterHealth { failing: [host].into(), ..Default::default() },
                            false => ClusterHealth { pending: 1, ..Default::default() },
                        };
                        f.clusters.entry(name).or_insert((health, healthy_after));
                    }
                    f.cds_loaded = cds;
                }
            }
            let host = f.host.clone();
            for (name, (health, countdown)) in f.clusters.iter_mut() {
                if *countdown == 0 {
                    health.pending = 0;
                    health.failing.clear();
                    health.healthy = [host.clone().unwrap_or_else(|| format!("{name}:6443"))].into();
                } else if *countdown != u32::MAX {
                    *countdown -= 1;
                }
            }
            let missing: Vec<String> = f
                .live
                .iter()
                .chain(&f.module_live)
                .flat_map(|l| l.clusters.iter())
                .filter(|c| !f.clusters.contains_key(*c))
                .cloned()
                .collect();
            if !missing.is_empty() {
                let generation = f.live.as_ref().map(|l| l.generation.clone()).unwrap_or_default();
                f.violations.push(format!("table {generation} routes to absent clusters {missing:?}"));
            }
            f
        }

        /// Envoy having loaded whatever is on disk (e.g. at its start).
        fn load_now(&self) {
            let (lag, healthy) = {
                let f = self.0.lock().unwrap();
                (f.cds_lag, f.healthy_after)
            };
            self.with(|f| {
                f.lag_left = 0;
                f.healthy_after = 0;
            });
            drop(self.observe());
            self.with(|f| {
                f.cds_lag = lag;
                f.lag_left = lag;
                f.healthy_after = healthy;
            });
        }
    }

    impl EnvoyAdmin for FakeEnvoy {
        async fn clusters(&self) -> Result<BTreeMap<String, ClusterHealth>, AdminError> {
            Ok(self.observe().clusters.iter().map(|(k, (h, _))| (k.clone(), h.clone())).collect())
        }

        /// As [`super::super::admin::live_table_of`] reads it: the module's table where it differs.
        async fn live_table(&self) -> Result<Option<LiveTable>, AdminError> {
            let f = self.observe();
            let module = f
                .module_live
                .clone()
                .filter(|m| f.live.as_ref().is_some_and(|l| l.generation != m.generation));
            Ok(module.or_else(|| f.live.clone()))
        }

        async fn ecds_rejections(&self) -> Result<u64, AdminError> {
            Ok(self.observe().rejections)
        }

        async fn live_routes(&self) -> Result<Option<String>, AdminError> {
            Ok(self.observe().routes_live.clone())
        }

        async fn rds_rejections(&self) -> Result<u64, AdminError> {
            Ok(self.observe().route_rejections)
        }
    }

    /// A three-apiserver table: `claims` serve resourceclaims v1, `classes` deviceclasses v1alpha3.
    fn resources(generation: &str, claims: &[&str], classes: &[&str]) -> Resources {
        let all = ["a", "b", "c"];
        let mut t: TableConfig = serde_json::from_value(json!({
            "schema": 1,
            "generation": generation,
            "apiservers": all.iter().map(|id| json!({"id": id, "cluster": format!("skewgate-apiserver-{id}")})).collect::<Vec<_>>(),
            "poolCluster": "skewgate-pool",
            "groupVersions": [
                {"group": "", "version": "v1", "servedBy": all, "resources": {"pods": all}},
                {"group": "resource.k8s.io", "version": "v1", "servedBy": claims, "resources": {"resourceclaims": claims}},
                {"group": "resource.k8s.io", "version": "v1alpha3", "servedBy": classes, "resources": {"deviceclasses": classes}}
            ]
        }))
        .unwrap();
        t.assign_sets(|m| format!("skewgate-set-{}", m.join("_")));
        let endpoints: Vec<Endpoint> = all
            .iter()
            .zip(7001..)
            .map(|(id, port)| Endpoint { id: id.to_string(), address: "127.0.0.1".into(), port })
            .collect();
        let tls = UpstreamTls {
            peer_ca: "/ca".into(),
            client_cert: "/c".into(),
            client_key: "/k".into(),
            server_name: "kubernetes.default.svc".into(),
            health_user: "system:apiserver".into(),
            health_groups: vec!["system:authenticated".into()],
        };
        // Unsealed, so that the generation stays the label the tests follow.
        let cds = skewgate_envoy::cds(&t, &endpoints, &tls, Health::default()).unwrap();
        let json = serde_json::to_string(&t).unwrap();
        let ecds = skewgate_envoy::ecds(&json, Path::new("/f.wasm"));
        let rds = Value::Null;
        with_route_timeout(
            Resources { table: t.clone(), generation: t.generation.clone(), cds, rds, ecds },
            "65s",
        )
    }

    /// `r` with the routes of its table and this route timeout.
    fn with_route_timeout(mut r: Resources, timeout: &str) -> Resources {
        let table = RoutingTable::from_json(serde_json::to_string(&r.table).unwrap().as_bytes()).unwrap();
        r.rds = skewgate_envoy::rds(Some(&table), timeout);
        r
    }

    fn dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("skewgate-push-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    fn pusher(dir: &Path, admin: Option<FakeEnvoy>) -> Pusher<FakeEnvoy> {
        Pusher::new(&Files::new(dir), admin, Duration::from_millis(600), Duration::from_millis(60))
    }

    /// The steps of a push that must have gone out.
    async fn pushed(p: &Pusher<FakeEnvoy>, resources: &Resources) -> Vec<Step> {
        match p.push(resources).await.unwrap() {
            PushOutcome::Pushed { steps, .. } => steps,
            other => panic!("not pushed: {other:?}"),
        }
    }

    /// A pusher whose first table (g1: c alone serves resourceclaims) Envoy has loaded.
    async fn after_first_table(name: &str) -> (PathBuf, FakeEnvoy, Pusher<FakeEnvoy>) {
        let d = dir(name);
        let envoy = FakeEnvoy::new(&d);
        let p = pusher(&d, Some(envoy.clone()));
        p.push(&resources("g1", &["c"], &["a", "b"])).await.unwrap();
        envoy.load_now();
        (d, envoy, p)
    }

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    fn inode(path: &Path) -> u64 {
        std::fs::metadata(path).unwrap().ino()
    }

    /// F3: a file someone else wrote is put back; one this sidecar wrote, or the same bytes
    /// written again, is left alone; a restarted sidecar guards files it did not write itself.
    #[tokio::test]
    async fn files_written_by_someone_else_are_put_back() {
        let d = dir("restore");
        let p = pusher(&d, None);
        let r1 = resources("g1", &["c"], &["a", "b"]);
        p.push(&r1).await.unwrap();
        let (cds, ecds) = (d.join("cds/cds.json"), d.join("ecds/ecds.json"));
        let good = std::fs::read(&ecds).unwrap();
        assert!(p.restore_replaced_files(false).unwrap().is_empty());
        write_atomic(&ecds, b"{\"resources\": []}").unwrap();
        assert_eq!(p.restore_replaced_files(false).unwrap(), std::slice::from_ref(&ecds));
        assert_eq!(std::fs::read(&ecds).unwrap(), good);
        write_atomic(&ecds, &good).unwrap();
        assert!(p.restore_replaced_files(false).unwrap().is_empty(), "the same bytes");
        // A push of the same table while a foreign file is there changes nothing about it.
        write_atomic(&ecds, b"{}").unwrap();
        assert_eq!(p.push(&r1).await.unwrap(), PushOutcome::Unchanged);
        assert_eq!(p.restore_replaced_files(false).unwrap(), std::slice::from_ref(&ecds));
        // The routes too.
        let rds = d.join("cds/rds.json");
        let good_rds = std::fs::read(&rds).unwrap();
        write_atomic(&rds, b"{\"resources\": []}").unwrap();
        assert_eq!(p.restore_replaced_files(false).unwrap(), std::slice::from_ref(&rds));
        assert_eq!(std::fs::read(&rds).unwrap(), good_rds);
        // In place, same length: the mtime or inode tells.
        let text = std::fs::read_to_string(&cds).unwrap().replace("\"skewgate-pool\"", "\"skewgate-nope\"");
        std::fs::write(&cds, text).unwrap();
        assert_eq!(p.restore_replaced_files(false).unwrap(), std::slice::from_ref(&cds));
        // A new process adopts what it finds when it would write the same.
        let restarted = pusher(&d, None);
        assert_eq!(restarted.push(&r1).await.unwrap(), PushOutcome::Unchanged);
        write_atomic(&cds, b"{}").unwrap();
        assert_eq!(restarted.restore_replaced_files(false).unwrap(), [cds]);
        let (writes, generation, clusters) = restarted.expected();
        assert_eq!((writes, generation.as_deref()), (1, Some("g1")));
        assert!(clusters.contains("skewgate-pool"));
        write_atomic(&rds, b"{}").unwrap();
        assert_eq!(restarted.restore_replaced_files(false).unwrap(), [rds]);
    }

    /// A new process whose first push writes only the table (the clusters on disk are already
    /// right) guards the clusters' file too.
    #[tokio::test]
    async fn files_a_push_did_not_need_to_write_are_guarded_too() {
        let d = dir("restore-unwritten");
        let r1 = resources("g1", &["c"], &["a", "b"]);
        pusher(&d, None).push(&r1).await.unwrap();
        let cds = d.join("cds/cds.json");
        let restarted = pusher(&d, None);
        let r2 = resources("g2", &["c"], &["a", "b"]);
        assert_eq!(r2.cds, r1.cds, "the same clusters: only the table changes");
        assert!(matches!(restarted.push(&r2).await.unwrap(), PushOutcome::Pushed { .. }));
        let good = std::fs::read(&cds).unwrap();
        write_atomic(&cds, b"{\"resources\": []}").unwrap();
        assert_eq!(restarted.restore_replaced_files(false).unwrap(), std::slice::from_ref(&cds));
        assert_eq!(std::fs::read(&cds).unwrap(), good);
    }

    #[tokio::test]
    async fn first_push_writes_both_then_nothing_until_a_change() {
        let d = dir("first");
        let envoy = FakeEnvoy::new(&d);
        let p = pusher(&d, Some(envoy.clone()));
        let r1 = resources("g1", &["c"], &["a", "b"]);
        let PushOutcome::Pushed { steps, removed, .. } = p.push(&r1).await.unwrap() else {
            panic!("not pushed")
        };
        assert_eq!(steps.len(), 3);
        let routes = rds_version(&r1.rds).unwrap();
        assert!(
            matches!(&steps[..], [Step::WroteCds(_), Step::WroteRds(v), Step::WroteEcds(g)] if g == "g1" && v == routes),
            "{steps:?}"
        );
        assert!(removed.is_empty());
        assert_eq!(envoy.0.lock().unwrap().calls, 0, "no Envoy can be running on missing files");
        let (cds_inode, ecds_inode) = (inode(&d.join("cds/cds.json")), inode(&d.join("ecds/ecds.json")));
        envoy.load_now();
        assert_eq!(p.push(&r1).await.unwrap(), PushOutcome::Unchanged);
        assert_eq!(p.push(&resources("g1", &["c"], &["a", "b"])).await.unwrap(), PushOutcome::Unchanged);
        assert_eq!(
            (inode(&d.join("cds/cds.json")), inode(&d.join("ecds/ecds.json"))),
            (cds_inode, ecds_inode)
        );
        // No stray temp files in the watched directories: cds.json and rds.json, ecds.json.
        for (sub, files) in [("cds", 2), ("ecds", 1)] {
            assert_eq!(std::fs::read_dir(d.join(sub)).unwrap().count(), files);
        }
    }

    #[tokio::test]
    async fn new_clusters_land_before_the_table_and_old_ones_leave_after() {
        let (_, envoy, p) = after_first_table("order").await;
        envoy.with(|f| {
            f.cds_lag = 3;
            f.lag_left = 3;
            f.healthy_after = 2;
        });
        // b moves to c's era: resourceclaims by b and c, deviceclasses by a only.
        let r2 = resources("g2", &["b", "c"], &["a"]);
        let outcome = p.push(&r2).await.unwrap();
        let PushOutcome::Pushed { added, removed, steps } = outcome else { panic!("not pushed") };
        assert_eq!(added, names(&["skewgate-set-a", "skewgate-set-b_c"]));
        assert_eq!(removed, names(&["skewgate-set-a_b", "skewgate-set-c"]));
        let base = ["skewgate-apiserver-a", "skewgate-apiserver-b", "skewgate-apiserver-c", "skewgate-pool"];
        let mut union: Vec<&str> = base.to_vec();
        union.extend(["skewgate-set-a", "skewgate-set-a_b", "skewgate-set-b_c", "skewgate-set-c"]);
        union.sort();
        let mut fin: Vec<&str> = base.to_vec();
        fin.extend(["skewgate-set-a", "skewgate-set-b_c"]);
        fin.sort();
        // The routes name the sets' clusters too (the bypass routes of rerouted GVRs): they go
        // once the new clusters are there, and before the old ones leave.
        let routes = rds_version(&r2.rds).unwrap().to_owned();
        assert_eq!(
            steps,
            [
                Step::WroteCds(names(&union)),
                Step::ClustersPresent,
                Step::WroteRds(routes.clone()),
                Step::RoutesLive(routes),
                Step::WroteEcds("g2".into()),
                Step::TableLive("g2".into()),
                Step::WroteCds(names(&fin)),
            ]
        );
        envoy.load_now();
        let f = envoy.0.lock().unwrap();
        assert!(f.violations.is_empty(), "{:?}", f.violations);
        assert_eq!(f.clusters.keys().map(String::as_str).collect::<Vec<_>>(), fin);
        assert_eq!(f.live.as_ref().map(|l| l.generation.as_str()), Some("g2"));
    }

    /// New routes go after the clusters and before the table, each confirmed; routes that
    /// alone changed go out without the table.
    #[tokio::test]
    async fn routes_go_between_the_clusters_and_the_table() {
        let (_, envoy, p) = after_first_table("routes-order").await;
        let r2 = with_route_timeout(resources("g2", &["b", "c"], &["a"]), "10s");
        let v2 = rds_version(&r2.rds).unwrap().to_owned();
        let steps = pushed(&p, &r2).await;
        let cds_sizes: Vec<usize> = steps
            .iter()
            .filter_map(|s| if let Step::WroteCds(c) = s { Some(c.len()) } else { None })
            .collect();
        assert_eq!(cds_sizes, [8, 6], "the union first, the new clusters last: {steps:?}");
        assert_eq!(
            steps[1..steps.len() - 1],
            [
                Step::ClustersPresent,
                Step::WroteRds(v2.clone()),
                Step::RoutesLive(v2),
                Step::WroteEcds("g2".into()),
                Step::TableLive("g2".into())
            ]
        );
        envoy.with(|f| assert_eq!(f.loads, ["rds", "ecds", "rds", "ecds"]));
        let r3 = with_route_timeout(resources("g2", &["b", "c"], &["a"]), "20s");
        let v3 = rds_version(&r3.rds).unwrap().to_owned();
        let steps = pushed(&p, &r3).await;
        assert_eq!(steps, [Step::ClustersPresent, Step::WroteRds(v3.clone()), Step::RoutesLive(v3)]);
        envoy.load_now();
        assert!(envoy.0.lock().unwrap().violations.is_empty());
    }

    /// Routes Envoy refuses keep the table back (its log says why), and the error says so.
    #[tokio::test]
    async fn rejected_routes_keep_the_table_back() {
        let (d, envoy, p) = after_first_table("routes-rejected").await;
        let ecds_before = std::fs::read(d.join("ecds/ecds.json")).unwrap();
        envoy.with(|f| f.reject_routes = true);
        let r2 = with_route_timeout(resources("g2", &["b", "c"], &["a"]), "10s");
        let error = p.push(&r2).await.unwrap_err();
        assert!(
            matches!(&error, PushError::RoutesRejected { version } if Some(version.as_str()) == rds_version(&r2.rds)),
            "{error}"
        );
        assert_eq!(error.label(), "routes_rejected");
        assert!(error.to_string().contains("rds.json"), "{error}");
        assert_eq!(
            std::fs::read(d.join("ecds/ecds.json")).unwrap(),
            ecds_before,
            "table written past its routes"
        );
        // The same routes again: on disk already, still not what Envoy runs.
        let error = p.push(&r2).await.unwrap_err();
        let first = resources("g1", &["c"], &["a", "b"]).rds;
        assert!(
            matches!(&error, PushError::RoutesNotLive { live, .. } if live.as_deref() == rds_version(&first)),
            "{error}"
        );
        // Envoy takes them after all (read again): the next push goes on with the table.
        envoy.with(|f| {
            f.reject_routes = false;
            f.rds_loaded.clear();
        });
        let steps = pushed(&p, &r2).await;
        assert!(
            matches!(&steps[..], [Step::ClustersPresent, Step::WroteEcds(g), Step::TableLive(_), Step::WroteCds(_)] if g == "g2"),
            "{steps:?}"
        );
    }

    #[tokio::test]
    async fn clusters_envoy_never_gets_keep_the_table_back() {
        let (d, envoy, p) = after_first_table("missing").await;
        let ecds_before = std::fs::read(d.join("ecds/ecds.json")).unwrap();
        envoy.with(|f| {
            f.cds_lag = 1000;
            f.lag_left = 1000;
        });
        let r2 = resources("g2", &["b", "c"], &["a"]);
        let error = p.push(&r2).await.unwrap_err();
        assert!(
            matches!(&error, PushError::ClustersMissing { missing, .. } if missing.contains(&"skewgate-set-b_c".to_string())),
            "{error}"
        );
        assert_eq!(error.label(), "clusters_missing");
        assert_eq!(
            std::fs::read(d.join("ecds/ecds.json")).unwrap(),
            ecds_before,
            "table written without its clusters"
        );
        // Envoy catches up: the next push resumes after the union CDS it already wrote.
        envoy.with(|f| {
            f.cds_lag = 0;
            f.lag_left = 0;
        });
        let steps = pushed(&p, &r2).await;
        assert!(
            matches!(
                &steps[..],
                [
                    Step::ClustersPresent,
                    Step::WroteRds(_),
                    Step::RoutesLive(_),
                    Step::WroteEcds(_),
                    Step::TableLive(_),
                    Step::WroteCds(_)
                ]
            ),
            "{steps:?}"
        );
        assert!(envoy.0.lock().unwrap().violations.is_empty());
    }

    #[tokio::test]
    async fn a_rejected_table_keeps_the_old_clusters() {
        let (d, envoy, p) = after_first_table("rejected").await;
        envoy.with(|f| f.reject = true);
        let error = p.push(&resources("g2", &["b", "c"], &["a"])).await.unwrap_err();
        assert!(matches!(error, PushError::TableRejected { .. }), "{error}");
        let cds: Value = serde_json::from_slice(&std::fs::read(d.join("cds/cds.json")).unwrap()).unwrap();
        let on_disk = cluster_names(Some(&cds));
        assert!(on_disk.contains("skewgate-set-a_b") && on_disk.contains("skewgate-set-c"), "{on_disk:?}");
        envoy.load_now();
        assert!(envoy.0.lock().unwrap().violations.is_empty());
    }

    /// A rejected table's file stays on disk: the same table pushed again is not "unchanged"
    /// until Envoy runs it (a sidecar believing otherwise would judge who may get requests
    /// against a table Envoy does not run).
    #[tokio::test]
    async fn after_a_failed_push_the_files_do_not_say_the_table_is_live() {
        let (d, envoy, p) = after_first_table("in-doubt").await;
        envoy.with(|f| f.reject = true);
        let r2 = resources("g2", &["b", "c"], &["a"]);
        assert!(matches!(p.push(&r2).await.unwrap_err(), PushError::TableRejected { .. }));
        envoy.with(|f| f.reject = false);
        let error = p.push(&r2).await.unwrap_err();
        assert!(matches!(error, PushError::TableNotLive { .. }), "{error}");
        // Envoy loads it again (the guard wrote it again): live, the old clusters dropped, and
        // unchanged from then on.
        envoy.with(|f| f.ecds_loaded.clear());
        let PushOutcome::Pushed { removed, .. } = p.push(&r2).await.unwrap() else { panic!("not pushed") };
        assert_eq!(removed, names(&["skewgate-set-a_b", "skewgate-set-c"]));
        assert_eq!(envoy.0.lock().unwrap().live.as_ref().map(|l| l.generation.as_str()), Some("g2"));
        let calls = envoy.0.lock().unwrap().calls;
        assert_eq!(p.push(&r2).await.unwrap(), PushOutcome::Unchanged);
        assert_eq!(envoy.0.lock().unwrap().calls, calls, "no longer in doubt: Envoy is not asked");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[tokio::test]
    async fn unhealthy_new_clusters_are_waited_for_then_reported() {
        let (_, envoy, p) = after_first_table("unhealthy").await;
        envoy.with(|f| f.healthy_after = u32::MAX);
        let steps = pushed(&p, &resources("g2", &["b", "c"], &["a"])).await;
        assert!(
            steps.contains(&Step::ClustersUnhealthy(names(&["skewgate-set-a", "skewgate-set-b_c"]))),
            "{steps:?}"
        );
        assert!(steps.contains(&Step::TableLive("g2".into())), "{steps:?}");
    }

    /// A restarting apiserver's new set clusters fail their first health check until it is
    /// ready: the table that routes the other GVRs around it must not wait for that.
    #[tokio::test]
    async fn clusters_checked_and_failing_do_not_hold_the_table() {
        let (_, envoy, p) = after_first_table("checked-unhealthy").await;
        envoy.with(|f| {
            f.healthy_after = u32::MAX;
            f.checked_unhealthy = true;
        });
        let steps = pushed(&p, &resources("g2", &["b", "c"], &["a"])).await;
        assert!(!steps.iter().any(|s| matches!(s, Step::ClustersUnhealthy(_))), "{steps:?}");
        assert!(steps.contains(&Step::TableLive("g2".into())), "{steps:?}");
    }

    /// A new set cluster of apiservers that are up elsewhere, whose first health check failed
    /// (slower than its timeout on a loaded node): the table waits for its next one rather than
    /// route to a cluster Envoy counts empty.
    #[tokio::test]
    async fn a_first_check_failed_of_an_apiserver_up_elsewhere_is_waited_for() {
        let (_, envoy, p) = after_first_table("up-elsewhere").await;
        envoy.with(|f| {
            f.host = Some("10.0.0.1:6443".into());
            for (health, _) in f.clusters.values_mut() {
                health.healthy = ["10.0.0.1:6443".to_owned()].into();
            }
            f.healthy_after = 6;
            f.checked_unhealthy = true;
        });
        let steps = pushed(&p, &resources("g2", &["b", "c"], &["a"])).await;
        assert!(!steps.iter().any(|s| matches!(s, Step::ClustersUnhealthy(_))), "{steps:?}");
        assert!(steps.contains(&Step::TableLive("g2".into())), "{steps:?}");
        envoy.with(|f| assert!(f.routed_unhealthy.is_empty(), "routed to {:?}", f.routed_unhealthy));
    }

    #[tokio::test]
    async fn without_an_admin_api_each_step_settles() {
        let d = dir("settle");
        let p = pusher(&d, None);
        p.push(&resources("g1", &["c"], &["a", "b"])).await.unwrap();
        let steps = pushed(&p, &resources("g2", &["b", "c"], &["a"])).await;
        assert!(
            matches!(&steps[..], [Step::WroteCds(u), Step::Settled, Step::WroteRds(_), Step::Settled, Step::WroteEcds(_), Step::Settled, Step::WroteCds(f)] if u.len() == 8 && f.len() == 6),
            "{steps:?}"
        );
    }

    /// The bypass routes of c, the only server of resourceclaims, leave with c and come back
    /// with it, without a push; a push while c is away writes the new routes without c's and
    /// finds them live by the rendering's version, and one after c came back finds nothing to do.
    #[tokio::test]
    async fn an_apiservers_own_routes_follow_the_overlay() {
        let (d, envoy, p) = after_first_table("routes-overlay").await;
        let g1 = resources("g1", &["c"], &["a", "b"]);
        let on_disk =
            || -> Value { serde_json::from_slice(&std::fs::read(d.join("cds/rds.json")).unwrap()).unwrap() };
        assert_eq!(on_disk(), g1.rds);
        let c = Overlay::draining(BTreeSet::from(["c".to_string()]));
        assert!(p.set_draining(&c).unwrap());
        let without_c = rds_with_overlay(&g1.rds, &c);
        assert_ne!(without_c, g1.rds, "c's routes are marked");
        assert_eq!(on_disk(), without_c);
        envoy.load_now();

        let g2 = resources("g2", &["c"], &["a"]);
        let steps = pushed(&p, &g2).await;
        let version = rds_version(&g2.rds).unwrap().to_owned();
        assert!(steps.contains(&Step::RoutesLive(version.clone())), "{steps:?}");
        assert_eq!(on_disk(), rds_with_overlay(&g2.rds, &c));
        assert_eq!(rds_version(&on_disk()), Some(format!("{version}+c").as_str()));

        // b stopping, c back: c's routes as rendered again (b serves nothing alone).
        let b = Overlay { stopping: BTreeSet::from(["b".to_string()]), ..Overlay::default() };
        assert!(p.set_draining(&b).unwrap());
        assert_eq!(on_disk(), g2.rds);
        envoy.load_now();
        assert!(matches!(p.push(&g2).await.unwrap(), PushOutcome::Unchanged));
    }

    /// `cds.json` with the endpoints of its EDS files inline again.
    fn cds_on_disk(d: &Path) -> Value {
        let read = |p: &Path| -> Option<Value> { serde_json::from_slice(&std::fs::read(p).ok()?).ok() };
        eds::join(&read(&d.join("cds/cds.json")).unwrap(), read)
    }

    /// The overlay goes into every cds.json written, the union of a push included, and changes
    /// on its own without touching the clusters; a new pusher adopts it from disk.
    #[tokio::test]
    async fn the_draining_overlay_survives_pushes_and_restarts() {
        let d = dir("overlay");
        let envoy = FakeEnvoy::new(&d);
        let p = pusher(&d, Some(envoy.clone()));
        let b = Overlay::draining(BTreeSet::from(["b".to_string()]));
        assert!(p.set_draining(&b).unwrap(), "nothing on disk yet: only the overlay changes");
        assert!(!d.join("cds/cds.json").exists());
        p.push(&resources("g1", &["c"], &["a", "b"])).await.unwrap();
        envoy.load_now();
        assert_eq!(draining_in(&cds_on_disk(&d)), b);
        let names_before = cluster_names(Some(&cds_on_disk(&d)));

        // b changed: the new table goes out with b still DRAINING, in the union and after.
        let steps = pushed(&p, &resources("g2", &["b", "c"], &["a"])).await;
        let wrote_cds = steps.iter().filter(|s| matches!(s, Step::WroteCds(_))).count();
        assert_eq!(wrote_cds, 2, "{steps:?}");
        assert_eq!(draining_in(&cds_on_disk(&d)), b);
        let eds_files: BTreeSet<String> = std::fs::read_dir(d.join("eds"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().trim_end_matches(".json").to_owned())
            .collect();
        assert_eq!(eds_files, cluster_names(Some(&cds_on_disk(&d))), "the files of dropped clusters go too");
        assert!(envoy.0.lock().unwrap().violations.is_empty());

        // Re-admitted: the clusters stay exactly as they are, only the overlay goes, and only
        // the endpoint files change: Envoy rebuilds no cluster.
        let before = cds_on_disk(&d);
        let cds_bytes = std::fs::read(d.join("cds/cds.json")).unwrap();
        assert!(p.set_draining(&Overlay::default()).unwrap());
        let after = cds_on_disk(&d);
        assert_eq!(draining_in(&after), Overlay::default());
        assert_eq!(with_draining(&before, &Overlay::default()), after);
        assert_eq!(std::fs::read(d.join("cds/cds.json")).unwrap(), cds_bytes, "cds.json rewritten");
        assert!(!p.set_draining(&Overlay::default()).unwrap(), "unchanged overlay: no write");
        assert_eq!(p.push(&resources("g2", &["b", "c"], &["a"])).await.unwrap(), PushOutcome::Unchanged);

        p.set_draining(&b).unwrap();
        let restarted = pusher(&d, Some(envoy.clone()));
        assert_eq!(restarted.adopt_draining_from_disk().unwrap(), b);
        assert_eq!(restarted.draining(), b);
        assert_ne!(names_before, cluster_names(Some(&cds_on_disk(&d))));
    }

    fn module_pusher(dir: &Path, admin: Option<FakeEnvoy>) -> Pusher<FakeEnvoy> {
        pusher(dir, admin).with_native_module(&Files::new(dir))
    }

    /// The module's file carries the filter's table, and goes after the clusters it names and
    /// before the filter's file, on the first push as on every change.
    #[tokio::test]
    async fn the_module_table_goes_between_the_clusters_and_the_filter() {
        let d = dir("module-order");
        let envoy = FakeEnvoy::new(&d);
        let p = module_pusher(&d, Some(envoy.clone()));
        let steps = pushed(&p, &resources("g1", &["c"], &["a", "b"])).await;
        assert!(
            matches!(&steps[..], [Step::WroteCds(_), Step::WroteModuleEcds(m), Step::WroteEcds(g)] if m == "g1" && g == "g1"),
            "{steps:?}"
        );
        let files = Files::new(&d);
        let read = |path: PathBuf| serde_json::from_slice::<Value>(&std::fs::read(path).unwrap()).unwrap();
        let (ecds, module) = (read(files.ecds_path()), read(files.module_ecds_path()));
        assert_eq!(module, module_ecds(table_from_ecds(&ecds).unwrap()));
        envoy.load_now();

        envoy.with(|f| {
            f.cds_lag = 3;
            f.lag_left = 3;
            f.healthy_after = 2;
        });
        let r2 = resources("g2", &["b", "c"], &["a"]);
        let steps = pushed(&p, &r2).await;
        assert!(
            matches!(
                &steps[..],
                [
                    Step::WroteCds(union),
                    Step::ClustersPresent,
                    Step::WroteModuleEcds(m),
                    Step::WroteEcds(g),
                    Step::TableLive(live),
                    Step::WroteCds(fin)
                ] if union.len() == 8 && m == "g2" && g == "g2" && live == "g2" && fin.len() == 6
            ),
            "{steps:?}"
        );
        let (ecds, module) = (read(files.ecds_path()), read(files.module_ecds_path()));
        assert_eq!(module, module_ecds(table_from_ecds(&ecds).unwrap()));
        envoy.load_now();
        envoy.with(|f| {
            assert!(f.violations.is_empty(), "{:?}", f.violations);
            assert_eq!(f.module_live.as_ref().map(|l| l.generation.as_str()), Some("g2"));
        });
        assert_eq!(p.push(&r2).await.unwrap(), PushOutcome::Unchanged);
    }

    /// Turning the module on over files a pusher without it wrote adds only the module's file;
    /// the guard puts it back like the other two.
    #[tokio::test]
    async fn the_module_file_joins_existing_files_and_is_guarded() {
        let d = dir("module-guard");
        let r1 = resources("g1", &["c"], &["a", "b"]);
        pusher(&d, None).push(&r1).await.unwrap();
        let p = module_pusher(&d, None);
        let steps = pushed(&p, &r1).await;
        assert_eq!(steps, [Step::Settled, Step::WroteModuleEcds("g1".into()), Step::Settled]);
        assert_eq!(p.push(&r1).await.unwrap(), PushOutcome::Unchanged);
        let module = Files::new(&d).module_ecds_path();
        let good = std::fs::read(&module).unwrap();
        write_atomic(&module, b"{\"resources\": []}").unwrap();
        assert_eq!(p.restore_replaced_files(false).unwrap(), std::slice::from_ref(&module));
        assert_eq!(std::fs::read(&module).unwrap(), good);
        // A restarted sidecar adopts the module's file with the other two.
        let restarted = module_pusher(&d, None);
        assert_eq!(restarted.push(&r1).await.unwrap(), PushOutcome::Unchanged);
        write_atomic(&module, b"{}").unwrap();
        assert_eq!(restarted.restore_replaced_files(false).unwrap(), std::slice::from_ref(&module));

        // Envoy running another table: both table files are written again, the module's first,
        // unless something was written since the mismatch was seen.
        let ecds = Files::new(&d).ecds_path();
        assert_eq!(restarted.table_paths(), [module.as_path(), ecds.as_path()]);
        let (writes, _, _) = restarted.expected();
        let inodes = (inode(&module), inode(&ecds));
        assert!(
            restarted.rewrite_if_unchanged_since(&restarted.table_paths(), writes - 1).unwrap().is_empty()
        );
        assert_eq!(
            restarted.rewrite_if_unchanged_since(&restarted.table_paths(), writes).unwrap(),
            [module.clone(), ecds.clone()]
        );
        assert_ne!((inode(&module), inode(&ecds)), inodes, "fresh inodes, for Envoy to load again");
        assert_eq!(std::fs::read(&module).unwrap(), good);
        assert_eq!(restarted.expected().0, writes + 2);
        assert!(restarted.restore_replaced_files(true).unwrap().is_empty());
    }
}
