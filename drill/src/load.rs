//! What the drill's load asks for: the GVRs it lists, watches and creates, each with the eras
//! that serve it. Stand-ins and real binaries emulating 1.33 have fixed tables; a real release
//! pair (the operator's old and new binaries) has the tables read from what each binary serves.

use serde::Serialize;
use serde_json::{Value, json};
use skewgate_harness::real::{Discovery, Listable};

use crate::{NEW, OLD};

/// Which eras serve a GVR.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Era {
    Old,
    New,
    Both,
}

impl Era {
    pub(crate) fn served_by(self, profile: &str) -> bool {
        match self {
            Era::Both => true,
            Era::Old => profile == OLD,
            Era::New => profile == NEW,
        }
    }
}

/// A resource the load asks for, and which eras serve it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gvr {
    pub api: Listable,
    pub era: Era,
}

impl Gvr {
    pub fn name(&self) -> String {
        self.api.name()
    }

    pub fn collection(&self) -> String {
        let api = &self.api;
        let prefix = match api.group.is_empty() {
            true => format!("/api/{}", api.version),
            false => format!("/apis/{}/{}", api.group, api.version),
        };
        match api.namespaced {
            true => format!("{prefix}/namespaces/default/{}", api.resource),
            false => format!("{prefix}/{}", api.resource),
        }
    }

    pub fn api_version(&self) -> String {
        match self.api.group.is_empty() {
            true => self.api.version.clone(),
            false => format!("{}/{}", self.api.group, self.api.version),
        }
    }

    /// The `spec` a created object of this kind gets: one its validation takes.
    pub fn spec(&self) -> Option<Value> {
        match (self.api.group.as_str(), self.api.kind.as_str()) {
            ("resource.k8s.io", "DeviceClass") => Some(json!({})),
            ("admissionregistration.k8s.io", "MutatingAdmissionPolicy") => Some(json!({
                "matchConstraints": {"resourceRules": [{
                    "apiGroups": ["drill.example.com"], "apiVersions": ["v1"],
                    "operations": ["CREATE"], "resources": ["nothings"]
                }]},
                "reinvocationPolicy": "Never",
                "mutations": [{"patchType": "ApplyConfiguration", "applyConfiguration": {"expression": "Object{}"}}]
            })),
            ("admissionregistration.k8s.io", "MutatingAdmissionPolicyBinding") => {
                Some(json!({"policyName": "drill-none"}))
            }
            _ => None,
        }
    }
}

fn gvr(group: &str, version: &str, resource: &str, kind: &str, namespaced: bool, era: Era) -> Gvr {
    let api = Listable {
        group: group.into(),
        version: version.into(),
        resource: resource.into(),
        kind: kind.into(),
        namespaced,
    };
    Gvr { api, era }
}

/// Lists: four GVRs of the old era only, four of the new era only, then pods and configmaps
/// (both eras; the watches take these two).
pub const LISTED: usize = 10;
/// The first of the two watched lists.
pub const WATCHED: usize = 8;
/// Creates: configmaps, one GVR of the old era, one of the new.
pub const CREATED: usize = 3;

/// The load of one drill.
#[derive(Debug, Clone)]
pub struct Load {
    /// [`LISTED`] GVRs: slots 0–3 the old era's, 4–7 the new era's (a GVR of both where an era
    /// has fewer), 8–9 pods and configmaps.
    pub lists: Vec<Gvr>,
    /// Created and read back: configmaps, then one GVR of each era (of both, where an era has
    /// none that can be created).
    pub creates: Vec<Gvr>,
    /// A GVR only the new era serves, for the `kubectl get` loop (none: no loop).
    pub kubectl: Option<Gvr>,
    /// Every GVR one era serves and the other does not: while some apiservers are upgraded and
    /// some not, these are served by only some of them.
    pub differ: Vec<Gvr>,
}

impl Load {
    /// The stand-ins' eras (1.33 and 1.36 captures).
    pub fn standins() -> Self {
        let lists = vec![
            gvr("resource.k8s.io", "v1alpha3", "deviceclasses", "DeviceClass", false, Era::Old),
            gvr("resource.k8s.io", "v1alpha3", "resourceclaims", "ResourceClaim", true, Era::Old),
            gvr("networking.k8s.io", "v1beta1", "ipaddresses", "IPAddress", false, Era::Old),
            gvr(
                "storage.k8s.io",
                "v1beta1",
                "volumeattributesclasses",
                "VolumeAttributesClass",
                false,
                Era::Old,
            ),
            gvr("resource.k8s.io", "v1", "resourceclaims", "ResourceClaim", true, Era::New),
            gvr("resource.k8s.io", "v1", "deviceclasses", "DeviceClass", false, Era::New),
            gvr(
                "storagemigration.k8s.io",
                "v1",
                "storageversionmigrations",
                "StorageVersionMigration",
                false,
                Era::New,
            ),
            gvr("storage.k8s.io", "v1", "volumeattributesclasses", "VolumeAttributesClass", false, Era::New),
            pods(),
            configmaps(),
        ];
        let creates = vec![
            configmaps(),
            gvr("resource.k8s.io", "v1alpha3", "deviceclasses", "DeviceClass", false, Era::Old),
            gvr("resource.k8s.io", "v1", "deviceclasses", "DeviceClass", false, Era::New),
        ];
        let kubectl = Some(lists[4].clone());
        Self::of(lists, creates, kubectl)
    }

    /// Real binaries, the old era a 1.36 kube-apiserver emulating 1.33 with betas on
    /// ([`skewgate_harness::real::REAL_OLD`]): DRA at v1beta1, and mutating admission policies
    /// new.
    pub fn emulated() -> Self {
        let mut load = Self::standins();
        load.lists[0].api.version = "v1beta1".into();
        load.lists[1].api.version = "v1beta1".into();
        load.lists[6] = gvr(
            "admissionregistration.k8s.io",
            "v1",
            "mutatingadmissionpolicies",
            "MutatingAdmissionPolicy",
            false,
            Era::New,
        );
        load.creates[1].api.version = "v1beta1".into();
        Self::of(load.lists, load.creates, load.kubectl)
    }

    /// A real release pair: the tables from what each release serves.
    pub fn release(old: &Discovery, new: &Discovery) -> anyhow::Result<Self> {
        let (old, new) = (old.listable()?, new.listable()?);
        let same = |a: &Listable, b: &Listable| {
            (&a.group, &a.version, &a.resource) == (&b.group, &b.version, &b.resource)
        };
        let mut gvrs: Vec<Gvr> = Vec::new();
        for api in &old {
            let era = if new.iter().any(|n| same(n, api)) { Era::Both } else { Era::Old };
            gvrs.push(Gvr { api: api.clone(), era });
        }
        for api in new.iter().filter(|n| !old.iter().any(|o| same(o, n))) {
            gvrs.push(Gvr { api: api.clone(), era: Era::New });
        }
        let listable = |era: Era| -> Vec<Gvr> {
            let mut all: Vec<Gvr> = gvrs.iter().filter(|g| g.era == era).cloned().collect();
            all.sort_by_key(|g| (g.api.namespaced, g.name()));
            all
        };
        let (olds, news, boths) = (listable(Era::Old), listable(Era::New), listable(Era::Both));
        for needed in [pods(), configmaps()] {
            if !boths.iter().any(|g| g.name() == needed.name()) {
                anyhow::bail!("{} is not served by both releases", needed.name());
            }
        }
        // Both releases' GVRs, other than the watched two, fill the slots an era leaves empty.
        let mut fillers =
            boths.iter().filter(|g| !g.api.group.is_empty() && g.api.resource != "events").cycle();
        let mut lists = Vec::with_capacity(LISTED);
        for era in [&olds, &news] {
            for i in 0..4 {
                match era.get(i) {
                    Some(g) => lists.push(g.clone()),
                    None => lists.push(fillers.next().cloned().unwrap_or_else(pods)),
                }
            }
        }
        lists.extend([pods(), configmaps()]);
        let creatable = |era: &[Gvr]| era.iter().find(|g| g.spec().is_some()).cloned();
        let both_creatable = boths.iter().find(|g| g.spec().is_some()).cloned().unwrap_or_else(configmaps);
        let creates = vec![
            configmaps(),
            creatable(&olds).unwrap_or_else(|| both_creatable.clone()),
            creatable(&news).unwrap_or(both_creatable),
        ];
        let kubectl = news.first().cloned();
        Ok(Self::of(lists, creates, kubectl))
    }

    fn of(lists: Vec<Gvr>, creates: Vec<Gvr>, kubectl: Option<Gvr>) -> Self {
        let mut differ: Vec<Gvr> = Vec::new();
        for g in lists.iter().chain(&creates).filter(|g| g.era != Era::Both) {
            if !differ.contains(g) {
                differ.push(g.clone());
            }
        }
        Self { lists, creates, kubectl, differ }
    }

    /// `kubectl get <resource>.<version>.<group> -A` for the loop.
    pub fn kubectl_args(&self) -> Option<[String; 3]> {
        self.kubectl.as_ref().map(|g| ["get".to_string(), g.name(), "-A".to_string()])
    }

    /// (name, resource, apiVersion) of every listed GVR, for `kubectl explain`.
    pub fn list_names(&self) -> Vec<(String, String, String)> {
        self.lists.iter().map(|g| (g.name(), g.api.resource.clone(), g.api_version())).collect()
    }
}

fn pods() -> Gvr {
    gvr("", "v1", "pods", "Pod", true, Era::Both)
}

fn configmaps() -> Gvr {
    gvr("", "v1", "configmaps", "ConfigMap", true, Era::Both)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn documents(apis: Value) -> Discovery {
        let core = json!({"kind": "APIGroupDiscoveryList", "apiVersion": "apidiscovery.k8s.io/v2", "items": [
            {"metadata": {"name": ""}, "versions": [{"version": "v1", "resources": [
                resource("pods", "Pod", true), resource("configmaps", "ConfigMap", true)
            ]}]}
        ]});
        Discovery { api: serde_json::to_vec(&core).unwrap(), apis: serde_json::to_vec(&apis).unwrap() }
    }

    fn resource(name: &str, kind: &str, namespaced: bool) -> Value {
        json!({"resource": name, "responseKind": {"group": "", "version": "", "kind": kind},
               "scope": if namespaced { "Namespaced" } else { "Cluster" },
               "singularResource": name.trim_end_matches('s'), "verbs": ["create", "get", "list", "watch"]})
    }

    fn group(name: &str, versions: &[(&str, Vec<Value>)]) -> Value {
        json!({"metadata": {"name": name}, "versions": versions.iter()
            .map(|(v, resources)| json!({"version": v, "resources": resources})).collect::<Vec<_>>()})
    }

    fn list(groups: Vec<Value>) -> Value {
        json!({"kind": "APIGroupDiscoveryList", "apiVersion": "apidiscovery.k8s.io/v2", "items": groups})
    }

    /// 1.35 → 1.36 as the real binaries differ by default: mutating admission policies new, no
    /// API dropped. The old era's slots take GVRs both serve; the new one's creatable kind is
    /// created.
    #[test]
    fn a_release_pair_lists_what_differs_and_fills_with_what_both_serve() {
        let shared = vec![
            group("resource.k8s.io", &[("v1", vec![resource("deviceclasses", "DeviceClass", false)])]),
            group("storage.k8s.io", &[("v1", vec![resource("storageclasses", "StorageClass", false)])]),
        ];
        let old = documents(list(shared.clone()));
        let mut newer = shared;
        newer.push(group(
            "admissionregistration.k8s.io",
            &[(
                "v1",
                vec![
                    resource("mutatingadmissionpolicies", "MutatingAdmissionPolicy", false),
                    resource("mutatingadmissionpolicybindings", "MutatingAdmissionPolicyBinding", false),
                ],
            )],
        ));
        let load = Load::release(&old, &documents(list(newer))).unwrap();
        let names: Vec<(String, Era)> = load.lists.iter().map(|g| (g.name(), g.era)).collect();
        assert_eq!(names[0], ("deviceclasses.v1.resource.k8s.io".into(), Era::Both));
        assert_eq!(names[1], ("storageclasses.v1.storage.k8s.io".into(), Era::Both));
        assert_eq!(names[4], ("mutatingadmissionpolicies.v1.admissionregistration.k8s.io".into(), Era::New));
        assert_eq!(
            names[5],
            ("mutatingadmissionpolicybindings.v1.admissionregistration.k8s.io".into(), Era::New)
        );
        assert_eq!(names[8..], [("pods.v1".into(), Era::Both), ("configmaps.v1".into(), Era::Both)]);
        assert_eq!(load.lists.len(), LISTED);
        assert_eq!(load.creates[1].name(), "deviceclasses.v1.resource.k8s.io");
        assert_eq!(load.creates[2].name(), "mutatingadmissionpolicies.v1.admissionregistration.k8s.io");
        assert_eq!(
            load.differ.iter().map(Gvr::name).collect::<Vec<_>>(),
            [
                "mutatingadmissionpolicies.v1.admissionregistration.k8s.io",
                "mutatingadmissionpolicybindings.v1.admissionregistration.k8s.io"
            ]
        );
        assert_eq!(
            load.kubectl_args().unwrap()[1],
            "mutatingadmissionpolicies.v1.admissionregistration.k8s.io"
        );
    }

    #[test]
    fn a_release_pair_needs_pods_and_configmaps_in_both() {
        let old =
            Discovery { api: b"{\"items\": []}".to_vec(), apis: serde_json::to_vec(&list(vec![])).unwrap() };
        let new = documents(list(vec![]));
        assert!(Load::release(&old, &new).unwrap_err().to_string().contains("pods.v1"));
    }

    #[test]
    fn the_fixed_tables_keep_their_positions() {
        for load in [Load::standins(), Load::emulated()] {
            assert_eq!(load.lists.len(), LISTED);
            assert!(load.lists[..4].iter().all(|g| g.era == Era::Old));
            assert!(load.lists[4..WATCHED].iter().all(|g| g.era == Era::New));
            assert_eq!(load.lists[WATCHED].api.resource, "pods");
            assert_eq!(
                load.creates.iter().map(|g| g.era).collect::<Vec<_>>(),
                [Era::Both, Era::Old, Era::New]
            );
        }
        assert_eq!(Load::emulated().kubectl_args().unwrap()[1], "resourceclaims.v1.resource.k8s.io");
    }
}
