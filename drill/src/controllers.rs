//! The controllers' workload, run only when the cluster has a real kube-controller-manager:
//! through the edge, as users do, owners of a kind only some apiservers serve during the upgrade
//! (resource.k8s.io/v1 ResourceClaims) and of a kind all serve (ConfigMaps, the control), each
//! with a dependent ConfigMap, in a namespace kept to the end; and namespaces created, filled
//! with such objects and deleted. Afterwards what etcd holds is read through a direct connection
//! to an apiserver that serves every kind involved ([`crate::harm`] counts).

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde_json::{Value, json};
use tokio::task::JoinHandle;

use crate::Shared;
use crate::harm::{Census, Deleted, Object, OwnedSet};

/// Where the owner sets live: never deleted, so every dependent must outlive the upgrade.
const SETS: &str = "drill-gc";
/// Namespaces deleted during the upgrade are named with this prefix.
const CHURN: &str = "drill-ns-";
const CLAIMS: &str = "/apis/resource.k8s.io/v1";
/// A new owner set of each kind this often.
const SET_PERIOD: Duration = Duration::from_secs(1);
/// A namespace created, filled and deleted this often.
const NAMESPACE_PERIOD: Duration = Duration::from_secs(3);
/// How long a deleted namespace may take before it counts as stuck: the namespace controller
/// waits 5 s before it checks for what is left, and retries with backoff.
const SETTLE: Duration = Duration::from_secs(60);

#[derive(Default)]
pub(crate) struct Workload {
    sets: Mutex<Vec<OwnedSet>>,
    deletions: Mutex<Vec<Deletion>>,
}

/// A deleted namespace and the task polling until it is gone.
struct Deletion {
    name: String,
    at: f64,
    poll: JoinHandle<Option<f64>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn claim(name: &str, namespace: &str) -> Value {
    json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu"}}]}}
    })
}

fn config_map(name: &str, namespace: &str, owner: Option<(&str, &str, &str, &str)>) -> Value {
    let mut cm = json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": namespace}, "data": {"k": "v"}
    });
    if let Some((api_version, kind, owner, uid)) = owner {
        cm["metadata"]["ownerReferences"] =
            json!([{"apiVersion": api_version, "kind": kind, "name": owner, "uid": uid}]);
    }
    cm
}

/// One POST through the edge, not retried (the next round makes another); the object's uid.
async fn create(s: &Shared, collection: &str, body: &Value) -> Option<String> {
    let url = format!("{}{collection}", s.base);
    let r = s.client.post(url).header("accept", "application/json").json(body).send().await.ok()?;
    if r.status() != 201 {
        return None;
    }
    let created: Value = r.json().await.ok()?;
    created["metadata"]["uid"].as_str().map(str::to_owned)
}

fn claims_in(namespace: &str) -> String {
    format!("{CLAIMS}/namespaces/{namespace}/resourceclaims")
}

fn config_maps_in(namespace: &str) -> String {
    format!("/api/v1/namespaces/{namespace}/configmaps")
}

impl Workload {
    /// The namespace of the owner sets, before the load starts (every apiserver is up then).
    pub(crate) async fn prepare(s: &Shared) -> Result<()> {
        let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": SETS}});
        let r = s.client.post(format!("{}/api/v1/namespaces", s.base)).json(&ns).send().await?;
        anyhow::ensure!(r.status() == 201 || r.status() == 409, "creating namespace {SETS}: {}", r.status());
        Ok(())
    }

    /// Owner sets until the load stops.
    pub(crate) async fn owners(self: Arc<Self>, s: Arc<Shared>) {
        let mut n = 0u64;
        while !s.stop.load(Ordering::SeqCst) {
            n += 1;
            for (kind, api_version, owner_at, owner) in [
                ("ResourceClaim", "resource.k8s.io/v1", claims_in(SETS), claim(&format!("owner-{n}"), SETS)),
                ("ConfigMap", "v1", config_maps_in(SETS), config_map(&format!("owner-{n}"), SETS, None)),
            ] {
                let name = format!("owner-{n}");
                let Some(uid) = create(&s, &owner_at, &owner).await else { continue };
                let dependent_name = format!("of-{}-{n}", kind.to_ascii_lowercase());
                let dependent = config_map(&dependent_name, SETS, Some((api_version, kind, &name, &uid)));
                let Some(dependent_uid) = create(&s, &config_maps_in(SETS), &dependent).await else {
                    continue;
                };
                lock(&self.sets).push(OwnedSet {
                    owner_kind: kind.into(),
                    owner: Object { kind: kind.into(), namespace: SETS.into(), name, uid },
                    dependent: Object {
                        kind: "ConfigMap".into(),
                        namespace: SETS.into(),
                        name: dependent_name,
                        uid: dependent_uid,
                    },
                });
            }
            tokio::time::sleep(SET_PERIOD).await;
        }
    }

    /// Namespaces created, given a claim and a ConfigMap, and deleted, until the load stops.
    pub(crate) async fn namespaces(self: Arc<Self>, s: Arc<Shared>) {
        let mut n = 0u64;
        while !s.stop.load(Ordering::SeqCst) {
            n += 1;
            let name = format!("{CHURN}{n}");
            let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}});
            if create(&s, "/api/v1/namespaces", &ns).await.is_some() {
                create(&s, &claims_in(&name), &claim("held", &name)).await;
                create(&s, &config_maps_in(&name), &config_map("held", &name, None)).await;
                let url = format!("{}/api/v1/namespaces/{name}", s.base);
                let (deleted, at) = (Instant::now(), s.epoch.elapsed().as_secs_f64());
                if s.client.delete(&url).send().await.is_ok_and(|r| r.status().is_success()) {
                    let s = s.clone();
                    let poll = tokio::spawn(async move { until_gone(&s, &url, deleted).await });
                    lock(&self.deletions).push(Deletion { name, at, poll });
                }
            }
            tokio::time::sleep(NAMESPACE_PERIOD).await;
        }
    }

    /// Waits (at most [`SETTLE`]) for the deleted namespaces to go, then reads what etcd holds
    /// through `direct` (an apiserver's URL and a client for it).
    pub(crate) async fn census(&self, client: &reqwest::Client, direct: &str) -> Result<Census> {
        let deadline = tokio::time::Instant::now() + SETTLE;
        let handles = std::mem::take(&mut *lock(&self.deletions));
        let mut deleted = Vec::new();
        for Deletion { name, at, mut poll } in handles {
            let took = match tokio::time::timeout_at(deadline, &mut poll).await {
                Ok(took) => took.ok().flatten(),
                Err(_) => {
                    poll.abort();
                    None
                }
            };
            deleted.push(Deleted { name, at, took });
        }
        let mut objects = items(client, direct, &format!("{CLAIMS}/resourceclaims"), "ResourceClaim").await?;
        objects.extend(items(client, direct, "/api/v1/configmaps", "ConfigMap").await?);
        objects.retain(|o| o.namespace.starts_with("drill-"));
        let namespaces: BTreeSet<String> = items(client, direct, "/api/v1/namespaces", "Namespace")
            .await?
            .into_iter()
            .map(|o| o.name)
            .collect();
        deleted.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(Census { sets: lock(&self.sets).clone(), deleted, objects, namespaces })
    }
}

/// Seconds from `deleted` until the namespace at `url` answers 404 (polled through the edge,
/// which every apiserver serves namespaces for), or `None` after twice [`SETTLE`].
async fn until_gone(s: &Shared, url: &str, deleted: Instant) -> Option<f64> {
    while deleted.elapsed() < SETTLE * 2 {
        if let Ok(r) = s.client.get(url).send().await {
            if r.status() == 404 {
                return Some(deleted.elapsed().as_secs_f64());
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    None
}

async fn items(client: &reqwest::Client, base: &str, path: &str, kind: &str) -> Result<Vec<Object>> {
    let url = format!("{base}{path}");
    let r = client.get(&url).header("accept", "application/json").send().await?;
    anyhow::ensure!(r.status() == 200, "GET {url}: {}", r.status());
    let list: Value = r.json().await.with_context(|| format!("GET {url}"))?;
    let items = list["items"].as_array().map(Vec::as_slice).unwrap_or_default();
    Ok(items
        .iter()
        .map(|i| {
            let m = &i["metadata"];
            let text = |k: &str| m[k].as_str().unwrap_or_default().to_string();
            Object { kind: kind.into(), namespace: text("namespace"), name: text("name"), uid: text("uid") }
        })
        .collect())
}
