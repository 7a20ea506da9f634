//! Envoy must not act for long on files this sidecar did not write. Envoy applies
//! any `cds.json`/`ecds.json` (or the native module's `module/ecds.json`) that parses the moment
//! it lands in its watched directory, so a file naming wrong clusters (or with wrong endpoints)
//! would be served until the next push.
//!
//! Two checks, both against what this sidecar last wrote ([`Pusher::restore_replaced_files`]):
//! - the files' inode, length and mtime, on every change inotify reports in their directories
//!   (the rename or write that Envoy itself reacts to) and every [`FILE_CHECK`] besides: a file
//!   that moved is read, and put back at once if its bytes differ; every [`READ_ALL_EVERY`]
//!   checks every file is read. Envoy cannot be told to refuse a route or cluster file, so the
//!   window such a file is live is what bounds its harm: about the time Envoy takes to load it
//!   and then the file put back (and, for clusters it had lost, their first health check);
//!   without inotify (a directory that cannot be watched), `FILE_CHECK` more, and for an edit
//!   that keeps inode, length and mtime, `READ_ALL_EVERY` times that;
//! - every [`LIVE_CHECK`], Envoy's admin API: the filter's table generation and the clusters
//!   Envoy has. A difference seen at two checks in a row with no write in between (a push under
//!   way is expected to differ for a moment) makes the files behind it be written again (clusters,
//!   then the table: the native module's and the filter's), once per write.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crate::envoy::admin::EnvoyAdmin;
use crate::envoy::push::{PushError, Pusher};
use crate::serve::Shared;

/// How often the files are checked (a `stat` each).
pub const FILE_CHECK: Duration = Duration::from_millis(100);
/// Every this many file checks the files are read whatever their metadata says.
pub const READ_ALL_EVERY: u32 = 10;
/// How often Envoy's admin API is asked.
pub const LIVE_CHECK: Duration = Duration::from_secs(1);

/// What the admin API shows against what the files say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LiveMismatch {
    /// The filter runs another table (or none).
    Table { expected: String, live: Option<String> },
    /// Envoy lacks clusters of `cds.json`.
    Clusters(BTreeSet<String>),
}

/// Compares what Envoy runs with what the files say (empty when they agree, or without an
/// admin API), with the write count the files go with.
pub async fn live_mismatch<A: EnvoyAdmin>(pusher: &Pusher<A>) -> Result<(u64, Vec<LiveMismatch>), PushError> {
    let (writes, generation, clusters) = pusher.expected();
    let Some(admin) = pusher.admin() else { return Ok((writes, Vec::new())) };
    let mut found = Vec::new();
    if let Some(expected) = generation {
        let live = admin.live_table().await?.map(|t| t.generation);
        if live.as_deref() != Some(expected.as_str()) {
            found.push(LiveMismatch::Table { expected, live });
        }
    }
    if !clusters.is_empty() {
        let have = admin.clusters().await?;
        let missing: BTreeSet<String> = clusters.into_iter().filter(|c| !have.contains_key(c)).collect();
        if !missing.is_empty() {
            found.push(LiveMismatch::Clusters(missing));
        }
    }
    Ok((writes, found))
}

/// Runs both checks until dropped, each on its own: a slow admin API never delays the file
/// check.
pub async fn run<A: EnvoyAdmin + Clone + 'static>(pusher: Pusher<A>, shared: Arc<Shared>) {
    tokio::join!(check_files(&pusher, &shared), check_live(&pusher, &shared));
}

async fn check_files<A: EnvoyAdmin>(pusher: &Pusher<A>, shared: &Shared) {
    let (changed_tx, mut changed) = tokio::sync::mpsc::channel(1);
    // Dropped with this task, which stops the watch.
    let _watch = watch(&pusher.dirs(), changed_tx);
    let mut files = tokio::time::interval(FILE_CHECK);
    files.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut checks: u32 = 0;
    loop {
        let read_all = tokio::select! {
            _ = files.tick() => {
                checks += 1;
                checks % READ_ALL_EVERY == 0
            }
            Some(()) = changed.recv() => false,
        };
        // A stat of each file (three, four with the native module): cheap enough for the
        // runtime's own threads; their bytes are read only when the stat moved, and once per
        // `READ_ALL_EVERY` ticks.
        match pusher.restore_replaced_files(read_all) {
            Ok(restored) => {
                for path in restored {
                    tracing::warn!(file = %path.display(), "Envoy's file was changed by someone else; put back");
                    shared.metrics.envoy_restores.get_or_create(&kind("file")).inc();
                }
            }
            Err(error) => tracing::warn!(%error, "cannot check Envoy's files"),
        }
    }
}

/// Watches `dirs` (not recursively: Envoy watches these directories alone)
/// and sends on `changed` when something in them is created, written, renamed or removed.
/// Events that come while one waits are one check. Where inotify cannot watch (logged), the
/// periodic check bounds the window alone.
fn watch(
    dirs: &BTreeSet<&Path>,
    changed: tokio::sync::mpsc::Sender<()>,
) -> Option<notify::RecommendedWatcher> {
    use notify::{EventKind, RecursiveMode, Watcher};
    let handler = move |event: notify::Result<notify::Event>| {
        // Access events (Envoy and this sidecar reading the files) change nothing.
        if event.is_ok_and(|e| !matches!(e.kind, EventKind::Access(_))) {
            // Full: a check is already due and will see this change too.
            let _ = changed.try_send(());
        }
    };
    let mut watcher = match notify::recommended_watcher(handler) {
        Ok(watcher) => watcher,
        Err(error) => {
            tracing::warn!(%error, "cannot watch Envoy's directories; checking its files every {FILE_CHECK:?}");
            return None;
        }
    };
    for dir in dirs {
        if let Err(error) = watcher.watch(dir, RecursiveMode::NonRecursive) {
            tracing::warn!(%error, dir = %dir.display(), "cannot watch a directory of Envoy's; checking its files every {FILE_CHECK:?}");
        }
    }
    Some(watcher)
}

async fn check_live<A: EnvoyAdmin>(pusher: &Pusher<A>, shared: &Shared) {
    let mut live = tokio::time::interval(LIVE_CHECK);
    live.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The write count and mismatch of the previous check, and the last write count acted on.
    let mut previous: Option<(u64, Vec<LiveMismatch>)> = None;
    let mut acted_on: Option<u64> = None;
    loop {
        live.tick().await;
        let now = match live_mismatch(pusher).await {
            Ok(now) => now,
            Err(error) => {
                tracing::debug!(%error, "cannot compare Envoy's live config");
                continue;
            }
        };
        let persistent = !now.1.is_empty() && previous.as_ref() == Some(&now);
        if persistent && acted_on != Some(now.0) {
            acted_on = Some(now.0);
            rewrite(pusher, shared, &now.1, now.0);
        }
        previous = Some(now);
    }
}

/// Writes the files behind `found` again, in push order: clusters, then the table's files (the
/// native module's too: with it, the table Envoy reports is the module's where the two differ).
fn rewrite<A: EnvoyAdmin>(pusher: &Pusher<A>, shared: &Shared, found: &[LiveMismatch], writes: u64) {
    let mut paths: Vec<&Path> = Vec::new();
    if found.iter().any(|m| matches!(m, LiveMismatch::Clusters(_))) {
        paths.push(pusher.cds_path());
    }
    if found.iter().any(|m| matches!(m, LiveMismatch::Table { .. })) {
        paths.extend(pusher.table_paths());
    }
    match pusher.rewrite_if_unchanged_since(&paths, writes) {
        Ok(rewritten) => {
            for path in rewritten {
                tracing::warn!(file = %path.display(), ?found, "Envoy runs something else than its files say; written again");
                shared.metrics.envoy_restores.get_or_create(&kind("live")).inc();
            }
        }
        Err(error) => tracing::warn!(%error, "cannot write Envoy's file again"),
    }
}

fn kind(kind: &str) -> crate::metrics::KindLabel {
    crate::metrics::KindLabel { kind: kind.to_owned() }
}
