//! Group/versions backed by a CustomResourceDefinition or an aggregated APIService (docs/upstream-facts.md, "Extension exclusion").
//!
//! Every apiserver serves them alike: CRDs from the same etcd, aggregated APIs from the same
//! extension server. Only their discovery differs, for a while: an apiserver that has not yet
//! seen a new CRD does not list it, and the aggregator marks a version `Stale` while it cannot
//! refresh it. Upstream (1.35+) therefore never proxies them to peers and never merges them from
//! peers. skewgate routes them to the pool whatever each discovery says (a set would be a
//! guess made from a lagging document), and in the peer-aggregated `/apis` keeps each one from
//! a single server, as upstream keeps the local view.
//!
//! They are learnt by listing `customresourcedefinitions` and `apiservices` (the caller does
//! the I/O): neither aggregated discovery's `freshness` (every built-in version is `Current`
//! too) nor legacy `/apis` (no source at all) tells a CRD from a built-in API.

use std::collections::BTreeSet;

use serde_json::Value;

use crate::discovery::ApiGroupDiscoveryList;

/// A set of (group, version).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Extensions(BTreeSet<(String, String)>);

impl Extensions {
    pub fn new(gvs: impl IntoIterator<Item = (String, String)>) -> Self {
        Self(gvs.into_iter().collect())
    }

    /// The group/versions of a `CustomResourceDefinitionList` and an `APIServiceList`
    /// (`apiextensions.k8s.io/v1`, `apiregistration.k8s.io/v1`).
    pub fn from_lists(crds: &Value, apiservices: &Value) -> Self {
        let mut gvs = BTreeSet::new();
        for crd in items(crds) {
            let spec = &crd["spec"];
            let Some(group) = spec["group"].as_str() else { continue };
            for version in spec["versions"].as_array().into_iter().flatten() {
                // A version that is not served is in no discovery and answers 404 everywhere.
                if version["served"].as_bool() == Some(false) {
                    continue;
                }
                if let Some(name) = version["name"].as_str() {
                    gvs.insert((group.to_owned(), name.to_owned()));
                }
            }
        }
        for service in items(apiservices) {
            let spec = &service["spec"];
            // Without `spec.service` the APIService is local: built-in, or the one the
            // autoregister controller makes for a CRD group (the CRD itself is listed above).
            if spec["service"].is_null() {
                continue;
            }
            if let (Some(group), Some(version)) = (spec["group"].as_str(), spec["version"].as_str()) {
                gvs.insert((group.to_owned(), version.to_owned()));
            }
        }
        Self(gvs)
    }

    pub fn contains(&self, group: &str, version: &str) -> bool {
        // Linear: a cluster has few of them, and a key would cost two allocations per look-up.
        self.0.iter().any(|(g, v)| g == group && v == version)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(g, v)| (g.as_str(), v.as_str()))
    }

    /// Removes each extension group/version from every list but the first (in `lists`' order)
    /// that has it; a group left without versions goes too. What upstream's peer cache does
    /// with excluded group/versions, the first listing server playing the local one.
    pub fn keep_first_listing(&self, lists: &mut [ApiGroupDiscoveryList]) {
        if self.is_empty() {
            return;
        }
        let mut kept: BTreeSet<(String, String)> = BTreeSet::new();
        for list in lists.iter_mut() {
            let mut seen_here = Vec::new();
            for group in &mut list.items {
                let name = group.name().to_owned();
                group.versions.retain(|v| {
                    if !self.contains(&name, &v.version) {
                        return true;
                    }
                    let key = (name.clone(), v.version.clone());
                    if kept.contains(&key) {
                        return false;
                    }
                    seen_here.push(key);
                    true
                });
            }
            list.items.retain(|g| !g.versions.is_empty());
            kept.extend(seen_here);
        }
    }
}

fn items(list: &Value) -> impl Iterator<Item = &Value> {
    list["items"].as_array().into_iter().flatten()
}

#[cfg(test)]
mod tests {

    use serde_json::json;

    use super::*;

    #[test]
    fn crds_and_remote_apiservices_count_local_apiservices_do_not() {
        let crds = json!({"items": [
            {"spec": {"group": "stable.example.com", "versions": [
                {"name": "v1", "served": true}, {"name": "v1beta1", "served": false}, {"name": "v2"}]}},
        ]});
        let apiservices = json!({"items": [
            {"spec": {"group": "metrics.k8s.io", "version": "v1beta1", "service": {"name": "metrics-server", "namespace": "kube-system"}}},
            {"spec": {"group": "apps", "version": "v1", "service": null}},
            {"spec": {"group": "stable.example.com", "version": "v1"}},
        ]});
        let e = Extensions::from_lists(&crds, &apiservices);
        let gvs: Vec<(&str, &str)> = e.iter().collect();
        assert_eq!(
            gvs,
            [("metrics.k8s.io", "v1beta1"), ("stable.example.com", "v1"), ("stable.example.com", "v2")]
        );
        assert!(e.contains("stable.example.com", "v1") && !e.contains("apps", "v1"));
        assert!(Extensions::from_lists(&json!({}), &json!({"items": "x"})).is_empty());
    }

    #[test]
    fn only_the_first_listing_keeps_an_extension() {
        let list = |versions: &[&str]| {
            let versions: Vec<Value> = versions
                .iter()
                .map(|v| json!({"version": v, "resources": [], "freshness": "Current"}))
                .collect();
            ApiGroupDiscoveryList::from_json(
                json!({"kind": "APIGroupDiscoveryList", "apiVersion": "apidiscovery.k8s.io/v2",
                    "metadata": {}, "items": [
                        {"metadata": {"name": "apps"}, "versions": [{"version": "v1", "resources": []}]},
                        {"metadata": {"name": "stable.example.com"}, "versions": versions}]})
                .to_string()
                .as_bytes(),
            )
            .unwrap()
        };
        let e = Extensions::new([("stable.example.com".to_owned(), "v1".to_owned())]);
        let mut lists = vec![list(&[]), list(&["v1"]), list(&["v1", "v2"])];
        e.keep_first_listing(&mut lists);
        let names = |l: &ApiGroupDiscoveryList| -> Vec<String> {
            l.items
                .iter()
                .flat_map(|g| g.versions.iter().map(move |v| format!("{}/{}", g.name(), v.version)))
                .collect()
        };
        assert_eq!(names(&lists[0]), ["apps/v1"], "a group without versions is dropped");
        assert_eq!(names(&lists[1]), ["apps/v1", "stable.example.com/v1"]);
        assert_eq!(names(&lists[2]), ["apps/v1", "stable.example.com/v2"], "v2 is not an extension");
    }
}
