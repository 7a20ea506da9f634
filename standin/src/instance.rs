//! One stand-in's state, shared by its request handlers ([`super::front`] takes every request
//! in), and what tests can read back afterwards.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use skewgate_core::request_info::RequestInfo;

use super::auth::{Auth, Identity};
use super::catalog::Catalog;
use super::profile::Profile;
use super::store_handle::StoreHandle;
use super::{discovery, openapi};

/// The response header that names the apiserver (stand-in or echo double) that answered.
pub const SERVED_BY: &str = "x-skewgate-served-by";

/// Largest request body accepted (kube-apiserver's `MaxRequestBodyBytes`).
pub const MAX_BODY: usize = 3 * 1024 * 1024;
/// How many authenticated identities each stand-in remembers for tests.
const IDENTITIES_KEPT: usize = 32;
/// How many served requests each stand-in remembers for tests ([`crate::Standin::recent`]).
const REQUESTS_KEPT: usize = 512;

/// One request a stand-in answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Served {
    /// The `Audit-Id` response header it carried.
    pub audit_id: String,
    pub method: String,
    /// The request target (path and query) as it arrived, before any decoding.
    pub target: String,
    pub status: u16,
    /// Who it was served as (`None`: not authenticated).
    pub identity: Option<Identity>,
}

/// What the request handlers share.
pub(crate) struct Instance {
    pub(crate) id: String,
    pub(crate) profile: Profile,
    pub(crate) auth: Auth,
    pub(crate) catalog: Catalog,
    pub(crate) discovery: discovery::Discovery,
    pub(crate) openapi: Arc<openapi::OpenApi>,
    /// `/version`.
    pub(crate) version: Bytes,
    pub(crate) store: StoreHandle,
    pub(crate) identities: Mutex<VecDeque<Identity>>,
    pub(crate) recent: Mutex<VecDeque<Served>>,
    pub(crate) watches: Mutex<BTreeMap<String, u64>>,
    pub(crate) ready: AtomicBool,
    /// False while a starting server's RBAC is not synced ([`Startup::forbidding`]).
    pub(crate) authorizing: AtomicBool,
    /// Whether `/readyz` fails because post-start hooks run (rather than a shutdown).
    pub(crate) starting: AtomicBool,
    /// Until when Envoy's health checks take this long to answer
    /// ([`crate::Standin::slow_health_checks`]).
    pub(crate) slow_health_checks: Mutex<Option<(tokio::time::Instant, Duration)>>,
    pub(crate) requests: Arc<AtomicU64>,
    pub(crate) bookmark_interval: Duration,
    pub(crate) stopping: tokio::sync::watch::Receiver<bool>,
    /// Discovery with the CRDs this stand-in has seen.
    pub(crate) crds: discovery::CrdView,
    /// In the EndpointSlice and with a Lease ([`Standin::publish`]).
    pub(crate) published: Mutex<bool>,
}

impl Instance {
    pub(crate) fn remember_served(&self, served: Served) {
        let mut recent = self.recent.lock().unwrap_or_else(PoisonError::into_inner);
        if recent.len() >= REQUESTS_KEPT {
            recent.pop_front();
        }
        recent.push_back(served);
    }

    pub(crate) fn count_watch(&self, info: &RequestInfo<'_>) {
        let mut key = format!("{}.{}", info.resource, info.api_version);
        if !info.api_group.is_empty() {
            key = format!("{key}.{}", info.api_group);
        }
        *self.watches.lock().unwrap_or_else(PoisonError::into_inner).entry(key).or_default() += 1;
    }

    pub(crate) fn remember(&self, identity: &Identity) {
        let mut seen = self.identities.lock().unwrap_or_else(PoisonError::into_inner);
        if seen.len() >= IDENTITIES_KEPT {
            seen.pop_front();
        }
        seen.push_back(identity.clone());
    }
}
