//! The object store every stand-in of a process shares, as kube-apiservers share etcd: one global
//! revision that every write bumps, objects keyed by (group, resource, namespace, name) and not by
//! version, and a bounded history of events that watches and lists at old revisions read.
//! Stand-ins in separate processes share one through `skewgate-harness store`
//! ([`super::store_service`], [`super::remote_store::RemoteStore`]).

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use tokio::sync::watch;

use super::clock;
use super::status::{Errors, Status, Target};

/// Where an object lives. Cluster-scoped objects have an empty namespace.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Key {
    pub group: String,
    pub resource: String,
    pub namespace: String,
    pub name: String,
}

impl Key {
    pub fn new(group: &str, resource: &str, namespace: &str, name: &str) -> Key {
        Key {
            group: group.to_string(),
            resource: resource.to_string(),
            namespace: namespace.to_string(),
            name: name.to_string(),
        }
    }

    pub fn namespace(name: &str) -> Key {
        Key::new("", "namespaces", "", name)
    }

    fn same_collection(&self, group: &str, resource: &str) -> bool {
        self.group == group && self.resource == resource
    }
}

/// What a list reads: one resource's objects (in one namespace, or all), at the current
/// revision or at `at` if the history still reaches back there. Also the remote store's
/// `/v1/list` request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListQuery {
    pub group: String,
    pub resource: String,
    pub namespace: Option<String>,
    pub at: Option<u64>,
}

impl ListQuery {
    pub fn new(group: &str, resource: &str, namespace: Option<&str>, at: Option<u64>) -> ListQuery {
        ListQuery { group: group.into(), resource: resource.into(), namespace: namespace.map(Into::into), at }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

/// One committed write.
#[derive(Debug, Clone)]
pub struct Event {
    pub revision: u64,
    pub kind: EventType,
    pub key: Key,
    /// The object after the write; for a deletion its last state stamped with the deletion's
    /// revision, as etcd-backed watches show it.
    pub object: Arc<Value>,
    /// The object before the write (None for a creation): lists at old revisions undo with it.
    pub previous: Option<Arc<Value>>,
}

/// What a write decided, given the current object.
pub enum Write {
    /// Store this object (create or replace); the store stamps `metadata.resourceVersion`.
    Put(Value),
    Delete,
    /// Delete every object in the namespace this key names, then the namespace itself.
    DeleteNamespace,
    /// Nothing changed: no revision, no event (an update that is a no-op, as upstream).
    Unchanged,
}

impl Write {
    /// What a dry run answers: the object the write would leave, nothing stored.
    pub(super) fn preview(self, current: Option<Arc<Value>>) -> Option<Arc<Value>> {
        match self {
            Write::Put(object) => Some(Arc::new(object)),
            Write::Unchanged | Write::Delete | Write::DeleteNamespace => current,
        }
    }
}

/// The shared object store. Cheap to share: `Arc<Store>`.
pub struct Store {
    state: Mutex<State>,
    revision: watch::Sender<u64>,
    history_size: usize,
}

struct State {
    revision: u64,
    objects: BTreeMap<Key, Arc<Value>>,
    history: VecDeque<Event>,
    /// Every event at or below this revision has left the history.
    compacted: u64,
}

/// Namespaces every cluster starts with.
pub const INITIAL_NAMESPACES: [&str; 4] = ["default", "kube-system", "kube-public", "kube-node-lease"];

impl Store {
    /// A store that keeps the last `history` events (watches and lists may start that far back).
    pub fn new(history: usize) -> Arc<Store> {
        let store = Arc::new(Store {
            state: Mutex::new(State {
                revision: 0,
                objects: BTreeMap::new(),
                history: VecDeque::new(),
                compacted: 0,
            }),
            revision: watch::channel(0).0,
            history_size: history,
        });
        for name in INITIAL_NAMESPACES {
            let namespace = new_namespace(name);
            // Cannot fail: the store is empty and the closure always puts.
            let _ = store.write(&Key::namespace(name), None, false, |_| Ok(Write::Put(namespace)));
        }
        store
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves consistent data: every mutation is a single
        // insert or remove after all checks.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The revision of the last write.
    pub fn revision(&self) -> u64 {
        self.lock().revision
    }

    /// Revisions at or below this one are no longer in the history.
    pub fn compacted(&self) -> u64 {
        self.lock().compacted
    }

    pub fn get(&self, key: &Key) -> Option<Arc<Value>> {
        self.lock().objects.get(key).cloned()
    }

    /// The objects `query` asks for, in key order, with the revision served.
    pub fn list(&self, query: &ListQuery) -> Result<(Vec<Arc<Value>>, u64), Status> {
        let state = self.lock();
        let in_scope = |key: &Key| {
            key.same_collection(&query.group, &query.resource)
                && query.namespace.as_ref().is_none_or(|ns| key.namespace == *ns)
        };
        let mut objects: BTreeMap<&Key, &Arc<Value>> =
            state.objects.iter().filter(|(key, _)| in_scope(key)).collect();
        let Some(at) = query.at.filter(|at| *at < state.revision) else {
            return Ok((objects.into_values().cloned().collect(), state.revision));
        };
        if at < state.compacted {
            return Err(Status::expired(at, state.compacted));
        }
        for event in state.history.iter().rev().take_while(|e| e.revision > at) {
            if !in_scope(&event.key) {
                continue;
            }
            match &event.previous {
                Some(previous) => objects.insert(&event.key, previous),
                None => objects.remove(&event.key),
            };
        }
        Ok((objects.into_values().cloned().collect(), at))
    }

    /// Events after `revision`, oldest first, at most `max`; `Err(compacted)` when some of them
    /// have already left the history.
    pub(super) fn events_after(&self, revision: u64, max: usize) -> Result<Vec<Event>, u64> {
        let state = self.lock();
        if revision < state.compacted {
            return Err(state.compacted);
        }
        let start = state.history.partition_point(|e| e.revision <= revision);
        Ok(state.history.range(start..).take(max).cloned().collect())
    }

    /// Ticks with the latest revision after every write.
    pub(super) fn subscribe(&self) -> watch::Receiver<u64> {
        self.revision.subscribe()
    }

    /// The one way to change the store: `decide` sees the current object (under the store's
    /// lock, so read-modify-write is atomic) and says what to do. `namespace`, if given, must
    /// exist (checked under the same lock). Returns the object written, the deleted object
    /// stamped with the deletion's revision, or the unchanged current one. A dry run decides
    /// and returns the same but commits nothing.
    pub(super) fn write(
        &self,
        key: &Key,
        namespace: Option<&str>,
        dry_run: bool,
        decide: impl FnOnce(Option<&Arc<Value>>) -> Result<Write, Status>,
    ) -> Result<Option<Arc<Value>>, Status> {
        let mut state = self.lock();
        if let Some(ns) = namespace.filter(|ns| !state.objects.contains_key(&Key::namespace(ns))) {
            return Err(Status::not_found(Target { group: "", resource: "namespaces" }, ns));
        }
        let current = state.objects.get(key).cloned();
        let decision = decide(current.as_ref())?;
        if dry_run {
            return Ok(decision.preview(current));
        }
        let result = match decision {
            Write::Unchanged => current,
            Write::Put(mut object) => {
                let revision = state.revision + 1;
                set_resource_version(&mut object, revision);
                let object = Arc::new(object);
                let kind = if current.is_some() { EventType::Modified } else { EventType::Added };
                state.commit(self, key.clone(), kind, object.clone(), current);
                Some(object)
            }
            Write::Delete => state.delete(self, key),
            Write::DeleteNamespace => {
                let contents: Vec<Key> =
                    state.objects.keys().filter(|k| k.namespace == key.name).cloned().collect();
                for inside in contents {
                    state.delete(self, &inside);
                }
                state.delete(self, key)
            }
        };
        // Published under the lock: two writers publishing after it could do so in the wrong
        // order, and the ticker would go back to an older revision and stay there; a long poll
        // waiting for a change from that revision would then miss the newer write.
        self.revision.send_replace(state.revision);
        drop(state);
        Ok(result)
    }
}

impl State {
    fn delete(&mut self, store: &Store, key: &Key) -> Option<Arc<Value>> {
        let current = self.objects.get(key).cloned()?;
        let mut last = (*current).clone();
        set_resource_version(&mut last, self.revision + 1);
        let last = Arc::new(last);
        self.commit(store, key.clone(), EventType::Deleted, last.clone(), Some(current));
        Some(last)
    }

    fn commit(
        &mut self,
        store: &Store,
        key: Key,
        kind: EventType,
        object: Arc<Value>,
        previous: Option<Arc<Value>>,
    ) {
        self.revision += 1;
        match kind {
            EventType::Deleted => self.objects.remove(&key),
            EventType::Added | EventType::Modified => self.objects.insert(key.clone(), object.clone()),
        };
        self.history.push_back(Event { revision: self.revision, kind, key, object, previous });
        while self.history.len() > store.history_size {
            match self.history.pop_front() {
                Some(gone) => self.compacted = gone.revision,
                None => break,
            }
        }
    }
}

/// `metadata` of an object, created if missing or not an object.
pub fn metadata_mut(object: &mut Value) -> Option<&mut Map<String, Value>> {
    let map = object.as_object_mut()?;
    let meta = map.entry("metadata").or_insert_with(|| json!({}));
    if !meta.is_object() {
        *meta = json!({});
    }
    meta.as_object_mut()
}

fn set_resource_version(object: &mut Value, revision: u64) {
    if let Some(meta) = metadata_mut(object) {
        meta.insert("resourceVersion".into(), Value::String(revision.to_string()));
    }
}

fn new_namespace(name: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": name,
            "uid": uuid::Uuid::new_v4().to_string(),
            "creationTimestamp": clock::now_rfc3339(),
            "labels": {"kubernetes.io/metadata.name": name},
        },
        "spec": {"finalizers": ["kubernetes"]},
        "status": {"phase": "Active"},
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cm(name: &str, data: &str) -> Value {
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": "default"}, "data": {"a": data}})
    }

    fn put(store: &Store, name: &str, data: &str) -> Arc<Value> {
        let object = cm(name, data);
        store
            .write(&Key::new("", "configmaps", "default", name), Some("default"), false, |_| {
                Ok(Write::Put(object))
            })
            .unwrap()
            .unwrap()
    }

    fn rv(object: &Value) -> u64 {
        object["metadata"]["resourceVersion"].as_str().unwrap().parse().unwrap()
    }

    #[test]
    fn starts_with_the_system_namespaces() {
        let store = Store::new(100);
        assert_eq!(store.revision(), 4);
        let (namespaces, revision) = store.list(&ListQuery::new("", "namespaces", None, None)).unwrap();
        assert_eq!(revision, 4);
        let names: Vec<&str> = namespaces.iter().map(|n| n["metadata"]["name"].as_str().unwrap()).collect();
        assert_eq!(names, ["default", "kube-node-lease", "kube-public", "kube-system"]);
    }

    #[test]
    fn every_write_bumps_the_revision_and_is_an_event() {
        let store = Store::new(100);
        let start = store.revision();
        let a = put(&store, "a", "1");
        let b = put(&store, "a", "2");
        assert_eq!((rv(&a), rv(&b)), (start + 1, start + 2));
        let gone = store
            .write(&Key::new("", "configmaps", "default", "a"), None, false, |_| Ok(Write::Delete))
            .unwrap();
        assert_eq!(rv(&gone.unwrap()), start + 3);
        let events = store.events_after(start, 10).unwrap();
        let kinds: Vec<EventType> = events.iter().map(|e| e.kind).collect();
        assert_eq!(kinds, [EventType::Added, EventType::Modified, EventType::Deleted]);
        assert_eq!(events.iter().map(|e| e.revision).collect::<Vec<_>>(), [start + 1, start + 2, start + 3]);
    }

    #[test]
    fn lists_at_old_revisions_until_compacted() {
        let store = Store::new(4);
        let a1 = put(&store, "a", "1");
        put(&store, "b", "1");
        put(&store, "a", "2");
        let (now, _) = store.list(&ListQuery::new("", "configmaps", Some("default"), None)).unwrap();
        assert_eq!(now[0]["data"]["a"], "2");
        let (then, at) =
            store.list(&ListQuery::new("", "configmaps", Some("default"), Some(rv(&a1)))).unwrap();
        assert_eq!(at, rv(&a1));
        assert_eq!(then.len(), 1);
        assert_eq!(then[0]["data"]["a"], "1");
        for i in 0..4 {
            put(&store, "c", &i.to_string());
        }
        let err = store.list(&ListQuery::new("", "configmaps", None, Some(rv(&a1)))).unwrap_err();
        assert_eq!((err.code, err.reason), (410, "Expired"));
        assert_eq!(store.events_after(rv(&a1), 10).unwrap_err(), store.compacted());
    }

    #[test]
    fn namespace_must_exist_and_deleting_it_empties_it() {
        let store = Store::new(100);
        let err = store
            .write(&Key::new("", "configmaps", "nope", "x"), Some("nope"), false, |_| {
                Ok(Write::Put(cm("x", "1")))
            })
            .unwrap_err();
        assert_eq!(err.message, r#"namespaces "nope" not found"#);
        put(&store, "a", "1");
        store.write(&Key::namespace("default"), None, false, |_| Ok(Write::DeleteNamespace)).unwrap();
        assert!(store.get(&Key::new("", "configmaps", "default", "a")).is_none());
        assert!(store.get(&Key::namespace("default")).is_none());
    }

    #[test]
    fn dry_runs_and_no_ops_leave_no_trace() {
        let store = Store::new(100);
        let start = store.revision();
        let key = Key::new("", "configmaps", "default", "a");
        let dry = store.write(&key, None, true, |_| Ok(Write::Put(cm("a", "1")))).unwrap();
        assert!(dry.is_some());
        assert!(store.get(&key).is_none());
        put(&store, "a", "1");
        store.write(&key, None, false, |_| Ok(Write::Unchanged)).unwrap();
        assert_eq!(store.revision(), start + 1);
    }
}
