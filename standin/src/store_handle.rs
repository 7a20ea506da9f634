//! The one seam between a stand-in and its object store: the in-process [`Store`] that the
//! stand-ins of one process share (the local cluster, the tests), or a [`RemoteStore`] served by
//! `skewgate-harness store` for stand-ins in separate processes or containers (docker-compose),
//! as kube-apiservers on separate machines share etcd.
//!
//! The request handlers are synchronous because the local store is a mutex around in-memory
//! maps; the local arm calls it directly, so the in-process path costs one match. The remote
//! arm blocks on loopback or container-network HTTP (see [`RemoteStore`]).

use std::sync::Arc;

use serde_json::Value;
use tokio::sync::watch;

use super::remote_store::RemoteStore;
use super::status::{Errors, Status};
use super::store::{Event, Key, ListQuery, Store, Write};

/// Where a stand-in keeps its objects. Cheap to clone.
#[derive(Clone)]
pub enum StoreHandle {
    Local(Arc<Store>),
    Remote(RemoteStore),
}

impl From<Arc<Store>> for StoreHandle {
    fn from(store: Arc<Store>) -> Self {
        StoreHandle::Local(store)
    }
}

impl From<RemoteStore> for StoreHandle {
    fn from(store: RemoteStore) -> Self {
        StoreHandle::Remote(store)
    }
}

impl StoreHandle {
    /// The revision of the last write.
    pub fn revision(&self) -> Result<u64, Status> {
        match self {
            StoreHandle::Local(store) => Ok(store.revision()),
            StoreHandle::Remote(remote) => remote.revision(),
        }
    }

    /// Revisions at or below this one are no longer in the history.
    pub fn compacted(&self) -> Result<u64, Status> {
        match self {
            StoreHandle::Local(store) => Ok(store.compacted()),
            StoreHandle::Remote(remote) => remote.compacted(),
        }
    }

    pub fn get(&self, key: &Key) -> Result<Option<Arc<Value>>, Status> {
        match self {
            StoreHandle::Local(store) => Ok(store.get(key)),
            StoreHandle::Remote(remote) => remote.get(key),
        }
    }

    /// [`Store::list`].
    pub fn list(&self, query: &ListQuery) -> Result<(Vec<Arc<Value>>, u64), Status> {
        match self {
            StoreHandle::Local(store) => store.list(query),
            StoreHandle::Remote(remote) => remote.list(query),
        }
    }

    /// Events after `revision`, oldest first, at most `max`; 410 Expired when some of them have
    /// already left the history.
    pub fn events_after(&self, revision: u64, max: usize) -> Result<Vec<Event>, Status> {
        match self {
            StoreHandle::Local(store) => {
                store.events_after(revision, max).map_err(|compacted| Status::expired(revision, compacted))
            }
            StoreHandle::Remote(remote) => remote.events_after(revision, max),
        }
    }

    /// [`Self::revision`] for async tasks: a remote store is awaited, not blocked on, so the
    /// task never holds a worker.
    pub async fn revision_async(&self) -> Result<u64, Status> {
        match self {
            StoreHandle::Local(store) => Ok(store.revision()),
            StoreHandle::Remote(remote) => remote.revision_async().await,
        }
    }

    /// [`Self::list`] for async tasks.
    pub async fn list_async(&self, query: &ListQuery) -> Result<(Vec<Arc<Value>>, u64), Status> {
        match self {
            StoreHandle::Local(store) => store.list(query),
            StoreHandle::Remote(remote) => remote.list_async(query).await,
        }
    }

    /// [`Self::events_after`] for async tasks.
    pub async fn events_after_async(&self, revision: u64, max: usize) -> Result<Vec<Event>, Status> {
        match self {
            StoreHandle::Local(store) => {
                store.events_after(revision, max).map_err(|compacted| Status::expired(revision, compacted))
            }
            StoreHandle::Remote(remote) => remote.events_after_async(revision, max).await,
        }
    }

    /// Ticks with the latest revision after every write (remote: as soon as the store's
    /// long poll reports it).
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        match self {
            StoreHandle::Local(store) => store.subscribe(),
            StoreHandle::Remote(remote) => remote.subscribe(),
        }
    }

    /// [`Store::write`]. `decide` may run more than once on a remote store: like
    /// kube-apiserver's `GuaranteedUpdate` against etcd, a write that lost a race re-reads the
    /// object and decides again, so `decide` must not assume it runs once.
    pub fn write(
        &self,
        key: &Key,
        namespace: Option<&str>,
        dry_run: bool,
        decide: impl FnMut(Option<&Arc<Value>>) -> Result<Write, Status>,
    ) -> Result<Option<Arc<Value>>, Status> {
        match self {
            StoreHandle::Local(store) => store.write(key, namespace, dry_run, decide),
            StoreHandle::Remote(remote) => remote.write(key, namespace, dry_run, decide),
        }
    }
}
