//! Watches: newline-delimited `{"type":…,"object":…}` events, streamed as they happen, read from
//! the store's history so that a watch from revision R sees exactly the events after R, in order.

use std::time::Duration;

use bytes::Bytes;
use serde_json::{Value, json};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use super::catalog::Resource;
use super::reply::{self, Reply};
use super::selector::{FieldSelector, LabelSelector};
use super::store::{Event, EventType, ListQuery};
use super::store_handle::StoreHandle;
use super::table::{self, Include};

/// Where a watch starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// Synthetic ADDED events for every current object, then live events; with `end_bookmark`
    /// a BOOKMARK annotated `k8s.io/initial-events-end` follows the initial ones.
    Current { end_bookmark: bool },
    /// Every event after this revision.
    After(u64),
}

pub struct Spec {
    pub resource: Resource,
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub labels: LabelSelector,
    pub fields: FieldSelector,
    pub start: Start,
    pub bookmarks: bool,
    pub bookmark_interval: Duration,
    pub timeout: Option<Duration>,
    pub table: Option<Include>,
}

/// How long before a watch's timeout upstream's cacher sends its last bookmark.
const PRE_TIMEOUT_BOOKMARK: Duration = Duration::from_secs(2);

/// How many events one watcher reads from the store per lock.
const BATCH: usize = 256;

pub fn serve(store: StoreHandle, spec: Spec, shutdown: watch::Receiver<bool>) -> Reply {
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(async move {
        let mut watcher = Watcher { spec, tx, shutdown, first_table: true };
        watcher.run(&store).await;
    });
    reply::stream("application/json", rx)
}

struct Watcher {
    spec: Spec,
    tx: mpsc::Sender<Bytes>,
    shutdown: watch::Receiver<bool>,
    first_table: bool,
}

impl Watcher {
    async fn run(&mut self, store: &StoreHandle) {
        let mut revisions = store.subscribe();
        revisions.borrow_and_update();
        let deadline = self.spec.timeout.map(|t| Instant::now() + t);
        let mut position = match self.spec.start {
            Start::After(revision) => revision,
            Start::Current { end_bookmark } => {
                let r = &self.spec.resource;
                let Ok((objects, revision)) = store
                    .list_async(&ListQuery::new(&r.group, &r.name, self.spec.namespace.as_deref(), None))
                    .await
                else {
                    return;
                };
                let selected: Vec<_> = objects.into_iter().filter(|o| self.selects(o)).collect();
                for object in &selected {
                    if !self.send_object("ADDED", object).await {
                        return;
                    }
                }
                if end_bookmark && !self.send_bookmark(revision, true).await {
                    return;
                }
                revision
            }
        };
        let mut ticker = tokio::time::interval_at(
            Instant::now() + self.spec.bookmark_interval,
            self.spec.bookmark_interval,
        );
        // A watcher held up by a slow client owes one bookmark, not a burst of them.
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // Upstream's cacher also sends one 2 s before the watch times out, so that the client
        // resumes from a fresh revision.
        let mut pre_timeout = deadline
            .and_then(|at| at.checked_sub(PRE_TIMEOUT_BOOKMARK))
            .filter(|at| *at > Instant::now() && self.spec.bookmarks);
        loop {
            revisions.borrow_and_update();
            loop {
                let events = match store.events_after_async(position, BATCH).await {
                    Ok(events) => events,
                    Err(status) => {
                        self.send_line("ERROR", &status.to_json()).await;
                        return;
                    }
                };
                if events.is_empty() {
                    break;
                }
                for event in &events {
                    position = event.revision;
                    if let Some((kind, object)) = self.filter(event)
                        && !self.send_object(kind, object).await
                    {
                        return;
                    }
                }
            }
            let timeout = async {
                match deadline {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            let before_timeout = async {
                match pre_timeout {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            let bookmark_due = tokio::select! {
                changed = revisions.changed() => if changed.is_err() { return } else { false },
                _ = ticker.tick(), if self.spec.bookmarks => true,
                () = before_timeout => {
                    pre_timeout = None;
                    true
                }
                () = timeout => return,
                _ = self.shutdown.wait_for(|stop| *stop) => return,
                () = self.tx.closed() => return,
            };
            if bookmark_due && !self.send_bookmark(position, false).await {
                return;
            }
        }
    }

    fn selects(&self, object: &Value) -> bool {
        let meta = &object["metadata"];
        self.spec.name.as_deref().is_none_or(|n| meta["name"] == n)
            && self.spec.labels.matches(object)
            && self.spec.fields.matches(object)
    }

    /// The event this watcher shows for a store event, if any: a change that makes an object
    /// enter or leave the selection is an ADDED or a DELETED, as upstream's watch cache says.
    fn filter<'e>(&self, event: &'e Event) -> Option<(&'static str, &'e Value)> {
        let r = &self.spec.resource;
        if event.key.group != r.group || event.key.resource != r.name {
            return None;
        }
        if self.spec.namespace.as_ref().is_some_and(|ns| *ns != event.key.namespace) {
            return None;
        }
        let now = self.selects(&event.object);
        let before = event.previous.as_deref().is_some_and(|p| self.selects(p));
        match event.kind {
            EventType::Added => now.then_some(("ADDED", &*event.object)),
            EventType::Deleted => before.then_some(("DELETED", &*event.object)),
            EventType::Modified => match (before, now) {
                (true, true) => Some(("MODIFIED", &*event.object)),
                (false, true) => Some(("ADDED", &*event.object)),
                (true, false) => Some(("DELETED", &*event.object)),
                (false, false) => None,
            },
        }
    }

    async fn send_object(&mut self, kind: &str, object: &Value) -> bool {
        let r = &self.spec.resource;
        let mut shown = object.clone();
        if let Some(map) = shown.as_object_mut() {
            map.insert("apiVersion".into(), Value::String(r.api_version()));
            map.insert("kind".into(), Value::String(r.kind.clone()));
        }
        if let Some(include) = self.spec.table {
            let rv = shown["metadata"]["resourceVersion"].as_str().unwrap_or_default().to_string();
            shown = table::table(r, &[shown], &rv, include, self.first_table);
            self.first_table = false;
        }
        self.send_line(kind, &shown.to_string()).await
    }

    async fn send_bookmark(&mut self, revision: u64, initial_events_end: bool) -> bool {
        let r = &self.spec.resource;
        let mut metadata = json!({"resourceVersion": revision.to_string(), "creationTimestamp": null});
        if initial_events_end && let Some(map) = metadata.as_object_mut() {
            map.insert("annotations".into(), json!({"k8s.io/initial-events-end": "true"}));
        }
        let object = json!({"kind": r.kind, "apiVersion": r.api_version(), "metadata": metadata});
        self.send_line("BOOKMARK", &object.to_string()).await
    }

    /// One `{"type":…,"object":…}` line, in upstream's field order. False when the client or
    /// the server is gone.
    async fn send_line(&mut self, kind: &str, object: &str) -> bool {
        let bytes = format!("{{\"type\":\"{kind}\",\"object\":{object}}}\n");
        tokio::select! {
            sent = self.tx.send(Bytes::from(bytes)) => sent.is_ok(),
            _ = self.shutdown.wait_for(|stop| *stop) => false,
        }
    }
}
