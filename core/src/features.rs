//! Skew below the GVR: features that some apiservers have and others lack although they serve the
//! same resources. A request that uses one goes to the apiservers that have it, learned from the
//! apiservers themselves (their `/metrics`); where none of those that serve the resource has it,
//! it goes where it would have gone, and gets the answer every one of them gives.
//!
//! Two kinds of use:
//! - `WatchList`, the streaming list (`watch` with `sendInitialEvents`), which kube-apiserver
//!   refuses with 422 when the gate is off (1.33's default, for instance) and which client-go's
//!   reflectors use first wherever their own gate is on: read from the query.
//! - Fields of a write's body that kube-apiserver drops or refuses while their gate is off
//!   ([`GATED`]): read from the body ([`crate::field_use`]). An apiserver with the gate on
//!   treats a body without the field exactly as one with it off, so a body that cannot be read
//!   goes to those with the gate too: nothing is dropped, at worst the load leans on them.

use std::collections::BTreeMap;

/// The feature gate of streaming lists.
pub const WATCH_LIST: &str = "WatchList";

/// Gates of fields (`kube_features.go`'s versioned specs: off by default in the releases named).
/// Volume attributes classes (beta and off in 1.33): a claim's or a volume's
/// `spec.volumeAttributesClassName`, dropped on write unless the stored object has one
/// (`DropDisabledSpecFields`), and any change of it refused once it has.
pub const VOLUME_ATTRIBUTES_CLASS: &str = "VolumeAttributesClass";
/// Pod-level `resources` (off in 1.33), in pods and every workload's pod template.
pub const POD_LEVEL_RESOURCES: &str = "PodLevelResources";
/// A pod's `hostnameOverride` (off in 1.34; 1.33 does not know it, and reports no such gate).
pub const HOSTNAME_OVERRIDE: &str = "HostnameOverride";
/// An autoscaler's scaling `tolerance` (off in 1.33 and 1.34).
pub const HPA_CONFIGURABLE_TOLERANCE: &str = "HPAConfigurableTolerance";
/// Deployments' and replica sets' `status.terminatingReplicas` (off in 1.33 and 1.34).
pub const TERMINATING_REPLICAS: &str = "DeploymentReplicaSetTerminatingReplicas";
/// A CSI driver's `nodeAllocatableUpdatePeriodSeconds` (off in 1.33 and 1.34).
pub const MUTABLE_CSI_NODE_ALLOCATABLE_COUNT: &str = "MutableCSINodeAllocatableCount";
/// A device class's `extendedResourceName` (off in 1.34 and 1.35).
pub const DRA_EXTENDED_RESOURCE: &str = "DRAExtendedResource";

/// The feature gates the edge routes on: the ones the sidecar reads from each apiserver. A gate's
/// position here is its bit in a gate mask.
pub const ROUTED: [&str; 8] = [
    WATCH_LIST,
    VOLUME_ATTRIBUTES_CLASS,
    POD_LEVEL_RESOURCES,
    HOSTNAME_OVERRIDE,
    HPA_CONFIGURABLE_TOLERANCE,
    TERMINATING_REPLICAS,
    MUTABLE_CSI_NODE_ALLOCATABLE_COUNT,
    DRA_EXTENDED_RESOURCE,
];

/// A gate's bit in a gate mask.
pub fn bit(gate: &str) -> u32 {
    ROUTED.iter().position(|g| *g == gate).map_or(0, |i| 1 << i)
}

/// One step of a field's path: its JSON name and its protobuf field number in the message that
/// holds it (`k8s.io/api`'s generated.proto).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Step {
    pub json: &'static str,
    pub proto: u32,
}

/// A field an apiserver drops or refuses on write while `gate` is off; set when present and not
/// null (the API's optional pointers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GatedField {
    pub gate: &'static str,
    pub path: &'static [Step],
}

/// The gated fields of writes to one resource (or one of its subresources).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GatedResource {
    pub group: &'static str,
    pub resource: &'static str,
    pub subresource: &'static str,
    pub fields: &'static [GatedField],
}

impl GatedResource {
    /// The gates of its fields, as a mask.
    pub fn gates(&self) -> u32 {
        self.fields.iter().fold(0, |m, f| m | bit(f.gate))
    }
}

const fn step(json: &'static str, proto: u32) -> Step {
    Step { json, proto }
}

const SPEC: Step = step("spec", 2);
const STATUS: Step = step("status", 3);
const POD_RESOURCES: Step = step("resources", 40);
const POD_HOSTNAME_OVERRIDE: Step = step("hostnameOverride", 41);
const TEMPLATE_2: Step = step("template", 2);
const TEMPLATE_3: Step = step("template", 3);
const TEMPLATE_6: Step = step("template", 6);
const JOB_TEMPLATE: Step = step("jobTemplate", 5);
const BEHAVIOR: Step = step("behavior", 5);
const TOLERANCE: Step = step("tolerance", 4);

/// The gated fields of a pod's spec, found at the path given (a workload's pod template).
macro_rules! pod_fields {
    ($($step:expr),*) => {
        &[
            GatedField { gate: POD_LEVEL_RESOURCES, path: &[$($step,)* POD_RESOURCES] },
            GatedField { gate: HOSTNAME_OVERRIDE, path: &[$($step,)* POD_HOSTNAME_OVERRIDE] },
        ]
    };
}

macro_rules! gated {
    ($subresource:literal $group:literal / $resource:literal: $fields:expr) => {
        GatedResource { group: $group, resource: $resource, subresource: $subresource, fields: $fields }
    };
}

/// The fields whose gates' defaults differ between the releases skewgate sees side by side
/// (kube-apiserver's drop-disabled-fields rules, pkg/api/*/util.go and the registries'
/// strategies, and the validation that forbids them), by the resource a write of them goes to.
/// Field numbers from `k8s.io/api`'s generated.proto; the same in every served version of each.
pub const GATED: &[GatedResource] = &[
    gated!("" "" / "persistentvolumeclaims": &[
        GatedField { gate: VOLUME_ATTRIBUTES_CLASS, path: &[SPEC, step("volumeAttributesClassName", 9)] },
    ]),
    gated!("status" "" / "persistentvolumeclaims": &[
        GatedField { gate: VOLUME_ATTRIBUTES_CLASS, path: &[STATUS, step("currentVolumeAttributesClassName", 8)] },
        GatedField { gate: VOLUME_ATTRIBUTES_CLASS, path: &[STATUS, step("modifyVolumeStatus", 9)] },
    ]),
    gated!("" "" / "persistentvolumes": &[
        GatedField { gate: VOLUME_ATTRIBUTES_CLASS, path: &[SPEC, step("volumeAttributesClassName", 10)] },
    ]),
    gated!("" "" / "pods": pod_fields!(SPEC)),
    gated!("" "" / "podtemplates": pod_fields!(TEMPLATE_2, SPEC)),
    gated!("" "" / "replicationcontrollers": pod_fields!(SPEC, TEMPLATE_3, SPEC)),
    gated!("" "apps" / "deployments": pod_fields!(SPEC, TEMPLATE_3, SPEC)),
    gated!("" "apps" / "replicasets": pod_fields!(SPEC, TEMPLATE_3, SPEC)),
    gated!("" "apps" / "statefulsets": pod_fields!(SPEC, TEMPLATE_3, SPEC)),
    gated!("" "apps" / "daemonsets": pod_fields!(SPEC, TEMPLATE_2, SPEC)),
    gated!("" "batch" / "jobs": pod_fields!(SPEC, TEMPLATE_6, SPEC)),
    gated!("" "batch" / "cronjobs": pod_fields!(SPEC, JOB_TEMPLATE, SPEC, TEMPLATE_6, SPEC)),
    gated!("status" "apps" / "deployments": &[
        GatedField { gate: TERMINATING_REPLICAS, path: &[STATUS, step("terminatingReplicas", 9)] },
    ]),
    gated!("status" "apps" / "replicasets": &[
        GatedField { gate: TERMINATING_REPLICAS, path: &[STATUS, step("terminatingReplicas", 7)] },
    ]),
    gated!("" "autoscaling" / "horizontalpodautoscalers": &[
        GatedField { gate: HPA_CONFIGURABLE_TOLERANCE, path: &[SPEC, BEHAVIOR, step("scaleUp", 1), TOLERANCE] },
        GatedField { gate: HPA_CONFIGURABLE_TOLERANCE, path: &[SPEC, BEHAVIOR, step("scaleDown", 2), TOLERANCE] },
    ]),
    gated!("" "storage.k8s.io" / "csidrivers": &[
        GatedField { gate: MUTABLE_CSI_NODE_ALLOCATABLE_COUNT, path: &[SPEC, step("nodeAllocatableUpdatePeriodSeconds", 9)] },
    ]),
    gated!("" "resource.k8s.io" / "deviceclasses": &[
        GatedField { gate: DRA_EXTENDED_RESOURCE, path: &[SPEC, step("extendedResourceName", 4)] },
    ]),
];

/// The gated fields of a write to `group`/`resource`/`subresource`, if it has any.
pub fn gated(group: &str, resource: &str, subresource: &str) -> Option<&'static GatedResource> {
    GATED.iter().find(|g| g.resource == resource && g.group == group && g.subresource == subresource)
}

/// The metric kube-apiserver (1.26+) reports every feature gate's state in, e.g.
/// `kubernetes_feature_enabled{name="WatchList",stage="BETA"} 1`.
pub const METRIC: &str = "kubernetes_feature_enabled";

/// The states of the [`ROUTED`] gates in a Prometheus text exposition. Where the text reports
/// gates at all, one of ours it leaves out is off: the apiserver is older than the gate (and
/// drops the field as unknown), or newer than the gate's removal after GA, where counting it off
/// only narrows a request to the apiservers that report it on. A text that reports no gate (no
/// metrics read) leaves every gate unknown, which the table takes as enabled.
pub fn from_metrics(text: &str) -> BTreeMap<String, bool> {
    let mut gates = BTreeMap::new();
    let mut reported = false;
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(METRIC).and_then(|r| r.strip_prefix('{')) else { continue };
        let Some((labels, value)) = rest.rsplit_once('}') else { continue };
        let Some(name) = label(labels, "name") else { continue };
        let enabled = match value.split_whitespace().next() {
            Some("1") => true,
            Some("0") => false,
            _ => continue,
        };
        reported = true;
        if let Some(gate) = ROUTED.iter().find(|g| **g == name) {
            gates.insert((*gate).to_owned(), enabled);
        }
    }
    if reported {
        for gate in ROUTED {
            gates.entry(gate.to_owned()).or_insert(false);
        }
    }
    gates
}

/// The value of `key` among Prometheus labels (`a="x",b="y"`); gate names need no escapes.
fn label<'a>(labels: &'a str, key: &str) -> Option<&'a str> {
    labels.split(',').find_map(|pair| {
        let (k, v) = pair.split_once('=')?;
        (k.trim() == key).then(|| v.trim().trim_matches('"'))
    })
}

#[cfg(test)]
mod tests {

    use super::*;

    #[test]
    fn reads_the_routed_gates() {
        let text = "# HELP kubernetes_feature_enabled [BETA] This metric records the data about the stage and enablement of a k8s feature.\n\
                    # TYPE kubernetes_feature_enabled gauge\n\
                    kubernetes_feature_enabled{name=\"VolumeAttributesClass\",stage=\"\"} 1\n\
                    kubernetes_feature_enabled{name=\"WatchList\",stage=\"BETA\"} 0\n\
                    kubernetes_feature_enabled_other{name=\"PodLevelResources\"} 1\n";
        let gates = from_metrics(text);
        assert_eq!((gates[WATCH_LIST], gates[VOLUME_ATTRIBUTES_CLASS]), (false, true));
        // Not reported by an apiserver that reports gates: off.
        assert_eq!(gates.len(), ROUTED.len());
        assert!(ROUTED[2..].iter().all(|g| !gates[*g]), "{gates:?}");
        let on = "kubernetes_feature_enabled{stage=\"BETA\",name=\"WatchList\"} 1 1700000000000";
        assert!(from_metrics(on)[WATCH_LIST]);
        // No gate reported (nothing read, or garbage): every gate unknown.
        assert!(from_metrics("").is_empty());
        assert!(from_metrics("kubernetes_feature_enabled{name=\"WatchList\"} NaN").is_empty());
        assert!(from_metrics("kubernetes_feature_enabled{name=\"WatchList\"").is_empty());
        assert!(from_metrics("process_open_fds 12\n").is_empty());
    }

    #[test]
    fn every_gated_field_has_a_routed_gate_and_a_path() {
        for resource in GATED {
            assert!(!resource.fields.is_empty(), "{}", resource.resource);
            for field in resource.fields {
                assert!(ROUTED.contains(&field.gate), "{} of {}", field.gate, resource.resource);
                assert!(
                    !field.path.is_empty() && field.path.iter().all(|s| s.proto > 0 && !s.json.is_empty())
                );
            }
            assert_eq!(gated(resource.group, resource.resource, resource.subresource), Some(resource));
        }
        assert!(ROUTED.len() <= 32, "a gate mask is a u32");
    }
}
