//! CustomResourceDefinitions, as kube-apiservers sharing one etcd serve them: a CRD created
//! through any stand-in is served by every one at once (its objects live in the shared store),
//! and appears in each one's discovery once that stand-in has seen it — after its injectable
//! discovery lag ([`crate::Standin::set_discovery_lag`]), the way one apiserver's discovery can
//! trail another's.

use std::sync::{Arc, PoisonError};

use serde_json::{Value, json};
use skewgate_core::discovery::ApiGroupDiscovery;

use super::catalog::Resource;
use super::discovery::Discovery;
use super::instance::Instance;
use super::store::ListQuery;
use super::store_handle::StoreHandle;

pub const GROUP: &str = "apiextensions.k8s.io";
pub const RESOURCE: &str = "customresourcedefinitions";

/// One served version of one CRD.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Served {
    group: String,
    version: String,
    plural: String,
    singular: String,
    kind: String,
    namespaced: bool,
    short_names: Vec<String>,
    categories: Vec<String>,
    status: bool,
}

const VERBS: [&str; 8] = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"];

fn served_versions(crd: &Value) -> Vec<Served> {
    let spec = &crd["spec"];
    let names = &spec["names"];
    let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    let list = |v: &Value| -> Vec<String> {
        v.as_array().into_iter().flatten().filter_map(Value::as_str).map(str::to_owned).collect()
    };
    let (group, plural) = (text(&spec["group"]), text(&names["plural"]));
    if group.is_empty() || plural.is_empty() {
        return Vec::new();
    }
    spec["versions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|v| v["served"].as_bool() != Some(false))
        .filter_map(|v| v["name"].as_str().map(|name| (name, v)))
        .map(|(name, v)| Served {
            group: group.clone(),
            version: name.to_owned(),
            plural: plural.clone(),
            singular: text(&names["singular"]),
            kind: text(&names["kind"]),
            namespaced: spec["scope"] != "Cluster",
            short_names: list(&names["shortNames"]),
            categories: list(&names["categories"]),
            status: !v["subresources"]["status"].is_null(),
        })
        .collect()
}

/// The resource a stored CRD serves at (group, version, plural), read from the store now.
pub(super) fn resource(store: &StoreHandle, group: &str, version: &str, plural: &str) -> Option<Resource> {
    // Cheap rejections first: the built-in groups have no CRDs behind them.
    if !group.contains('.') {
        return None;
    }
    let (crds, _) = store.list(&ListQuery::new(GROUP, RESOURCE, None, None)).ok()?;
    let found = crds
        .iter()
        .flat_map(|crd| served_versions(crd))
        .find(|s| s.group == group && s.version == version && s.plural == plural)?;
    Some(Resource {
        group: found.group,
        version: found.version,
        name: found.plural,
        singular: found.singular,
        kind: found.kind,
        namespaced: found.namespaced,
        verbs: VERBS.map(str::to_owned).to_vec(),
        subresources: match found.status {
            true => vec![super::catalog::Subresource {
                name: "status".into(),
                kind: (group.to_owned(), version.to_owned(), String::new()),
                verbs: vec!["get".into(), "patch".into(), "update".into()],
            }],
            false => Vec::new(),
        },
        short_names: found.short_names,
        categories: found.categories,
    })
}

/// Aggregated discovery groups for the CRDs in `crds`, in creation order.
fn groups(crds: &[Arc<Value>]) -> Vec<ApiGroupDiscovery> {
    // Group → version → resources, each in first-seen order.
    type Versions = Vec<(String, Vec<Value>)>;
    let mut groups: Vec<(String, Versions)> = Vec::new();
    for s in crds.iter().flat_map(|crd| served_versions(crd)) {
        let index = match groups.iter().position(|(g, _)| *g == s.group) {
            Some(i) => i,
            None => {
                groups.push((s.group.clone(), Vec::new()));
                groups.len() - 1
            }
        };
        let versions = &mut groups[index].1;
        let vi = match versions.iter().position(|(v, _)| *v == s.version) {
            Some(i) => i,
            None => {
                versions.push((s.version.clone(), Vec::new()));
                versions.len() - 1
            }
        };
        let mut resource = json!({
            "resource": s.plural,
            "responseKind": {"group": "", "version": "", "kind": s.kind},
            "scope": if s.namespaced { "Namespaced" } else { "Cluster" },
            "singularResource": s.singular,
            "verbs": VERBS,
        });
        if !s.short_names.is_empty() {
            resource["shortNames"] = json!(s.short_names);
        }
        if !s.categories.is_empty() {
            resource["categories"] = json!(s.categories);
        }
        if s.status {
            resource["subresources"] = json!([{"subresource": "status",
                "responseKind": {"group": "", "version": "", "kind": s.kind}, "verbs": ["get", "patch", "update"]}]);
        }
        versions[vi].1.push(resource);
    }
    groups
        .into_iter()
        .filter_map(|(name, versions)| {
            let versions: Vec<Value> = versions
                .into_iter()
                .map(|(v, resources)| json!({"version": v, "resources": resources, "freshness": "Current"}))
                .collect();
            serde_json::from_value(json!({"metadata": {"name": name}, "versions": versions})).ok()
        })
        .collect()
}

/// Follows the store's CRDs for one stand-in until it stops.
pub(super) async fn follow(instance: Arc<Instance>, address: String) {
    let mut revisions = instance.store.subscribe();
    let mut stopping = instance.stopping.clone();
    let mut seen = 0u64;
    let mut first = true;
    let mut shown: Vec<Arc<Value>> = Vec::new();
    loop {
        let revision = instance.store.revision_async().await.unwrap_or(seen);
        let touched = first
            || match instance.store.events_after_async(seen, usize::MAX).await {
                Ok(events) => events.iter().any(|e| e.key.group == GROUP && e.key.resource == RESOURCE),
                // Compacted past what was seen: look at the list itself.
                Err(_) => true,
            };
        seen = revision;
        first = false;
        if touched {
            let crds = instance
                .store
                .list_async(&ListQuery::new(GROUP, RESOURCE, None, None))
                .await
                .map(|(c, _)| c)
                .unwrap_or_default();
            let key = |list: &[Arc<Value>]| -> Vec<Value> {
                list.iter().map(|c| json!([c["metadata"]["name"], c["spec"]])).collect()
            };
            if key(&crds) != key(&shown) {
                let lag = instance.crds.lag();
                if !lag.is_zero() {
                    // The injected lag: this stand-in's discovery trails the store.
                    tokio::select! {
                        () = tokio::time::sleep(lag) => {}
                        _ = stopping.wait_for(|stop| *stop) => return,
                    }
                }
                let discovery = match crds.is_empty() {
                    true => None,
                    false => {
                        let mut profile = instance.profile.clone();
                        // Sorted by creation, as the CRD handler lists them.
                        let mut sorted = crds.clone();
                        sorted.sort_by_key(|c| {
                            c["metadata"]["resourceVersion"].as_str().and_then(|v| v.parse::<u64>().ok())
                        });
                        profile.apis.items.extend(groups(&sorted));
                        // Captured documents stay as captured; with CRDs, the derived form.
                        profile.capture = None;
                        Discovery::new(&profile, &address).ok().map(Arc::new)
                    }
                };
                *instance.crds.discovery.lock().unwrap_or_else(PoisonError::into_inner) = discovery;
                shown = crds;
            }
        }
        tokio::select! {
            changed = revisions.changed() => if changed.is_err() { return },
            _ = stopping.wait_for(|stop| *stop) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn served_versions_become_discovery_groups() {
        let crd = Arc::new(json!({"spec": {"group": "stable.example.com", "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "shortNames": ["wd"]},
            "versions": [{"name": "v1", "served": true, "subresources": {"status": {}}},
                         {"name": "v1beta1", "served": false}]}}));
        let groups = groups(&[crd]);
        assert_eq!(groups.len(), 1);
        assert_eq!(groups[0].name(), "stable.example.com");
        assert_eq!(groups[0].versions.len(), 1);
        let r = &groups[0].versions[0].resources[0];
        assert_eq!((r.resource.as_str(), r.scope.as_str()), ("widgets", "Namespaced"));
        assert_eq!(r.subresources.len(), 1);
    }
}
