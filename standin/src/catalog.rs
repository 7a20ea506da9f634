//! The resources one stand-in serves, indexed for request handling: a flattened view of its
//! profile's aggregated discovery.

use std::collections::HashMap;

use skewgate_core::discovery::{ApiGroupDiscoveryList, ApiResourceDiscovery};

use super::profile::Profile;

/// One top-level resource of one group-version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resource {
    pub group: String,
    pub version: String,
    /// Plural, as in the URL.
    pub name: String,
    pub singular: String,
    pub kind: String,
    pub namespaced: bool,
    pub verbs: Vec<String>,
    pub subresources: Vec<Subresource>,
    pub short_names: Vec<String>,
    pub categories: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subresource {
    pub name: String,
    /// (group, version, kind) of what it answers; group/version filled in from the parent's.
    pub kind: (String, String, String),
    pub verbs: Vec<String>,
}

impl Resource {
    /// `group/version`, or `v1` for core.
    pub fn api_version(&self) -> String {
        api_version(&self.group, &self.version)
    }

    pub fn allows(&self, verb: &str) -> bool {
        self.verbs.iter().any(|v| v == verb)
    }

    pub fn subresource(&self, name: &str) -> Option<&Subresource> {
        self.subresources.iter().find(|s| s.name == name)
    }

    /// Resources that exist only to be posted to (reviews, bindings, evictions): nothing is
    /// stored for them.
    pub fn is_create_only(&self) -> bool {
        self.verbs.len() == 1 && self.allows("create")
    }

    /// Whether writes to the resource itself leave `.status` alone (it has a status subresource).
    pub fn has_status(&self) -> bool {
        self.subresource("status").is_some()
    }
}

pub fn api_version(group: &str, version: &str) -> String {
    if group.is_empty() { version.to_string() } else { format!("{group}/{version}") }
}

/// Every group/version and resource a stand-in serves.
#[derive(Debug, Default)]
pub struct Catalog {
    resources: HashMap<(String, String, String), Resource>,
    /// group → versions in preference order; core is "".
    groups: Vec<(String, Vec<String>)>,
}

impl Catalog {
    pub fn new(profile: &Profile) -> Catalog {
        let mut catalog = Catalog::default();
        catalog.add(&profile.api);
        catalog.add(&profile.apis);
        catalog
    }

    fn add(&mut self, list: &ApiGroupDiscoveryList) {
        for group in &list.items {
            let mut versions = Vec::new();
            for version in &group.versions {
                versions.push(version.version.clone());
                for resource in &version.resources {
                    let r = resource_of(group.name(), &version.version, resource);
                    self.resources.insert((r.group.clone(), r.version.clone(), r.name.clone()), r);
                }
            }
            self.groups.push((group.name().to_string(), versions));
        }
    }

    pub fn get(&self, group: &str, version: &str, resource: &str) -> Option<&Resource> {
        self.resources.get(&(group.to_string(), version.to_string(), resource.to_string()))
    }

    /// Every (group, version) served, core first, in discovery order.
    pub fn group_versions(&self) -> impl Iterator<Item = (&str, &str)> {
        self.groups.iter().flat_map(|(g, vs)| vs.iter().map(move |v| (g.as_str(), v.as_str())))
    }

    /// The resources of one group/version, sorted by name.
    pub fn resources_of(&self, group: &str, version: &str) -> Vec<&Resource> {
        let mut found: Vec<&Resource> =
            self.resources.values().filter(|r| r.group == group && r.version == version).collect();
        found.sort_by(|a, b| a.name.cmp(&b.name));
        found
    }
}

fn resource_of(group: &str, version: &str, r: &ApiResourceDiscovery) -> Resource {
    let kind = r.response_kind.as_ref().map(|k| k.kind.clone()).unwrap_or_default();
    let subresources = r
        .subresources
        .iter()
        .map(|s| {
            let gvk = s.response_kind.clone().unwrap_or_default();
            let (g, v) = if gvk.group.is_empty() && gvk.version.is_empty() {
                (group.to_string(), version.to_string())
            } else {
                (gvk.group, gvk.version)
            };
            Subresource { name: s.subresource.clone(), kind: (g, v, gvk.kind), verbs: s.verbs.clone() }
        })
        .collect();
    Resource {
        group: group.to_string(),
        version: version.to_string(),
        name: r.resource.clone(),
        singular: r.singular_resource.clone(),
        kind,
        namespaced: r.scope == "Namespaced",
        verbs: r.verbs.clone(),
        subresources,
        short_names: r.short_names.clone(),
        categories: r.categories.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn core_and_groups_are_indexed() {
        let catalog = Catalog::new(&Profile::parse("1.36").unwrap());
        let cm = catalog.get("", "v1", "configmaps").unwrap();
        assert_eq!(cm.kind, "ConfigMap");
        assert!(cm.namespaced && cm.allows("watch") && !cm.has_status());
        let claims = catalog.get("resource.k8s.io", "v1", "resourceclaims").unwrap();
        assert!(claims.has_status());
        assert_eq!(claims.api_version(), "resource.k8s.io/v1");
        let ns = catalog.get("", "v1", "namespaces").unwrap();
        assert!(!ns.namespaced);
        assert!(catalog.get("authentication.k8s.io", "v1", "selfsubjectreviews").unwrap().is_create_only());
        assert_eq!(catalog.group_versions().next(), Some(("", "v1")));
        let scale = catalog.get("apps", "v1", "deployments").unwrap().subresource("scale").unwrap();
        assert_eq!(scale.kind, ("autoscaling".into(), "v1".into(), "Scale".into()));
    }
}
