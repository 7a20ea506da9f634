//! Real `/apis` documents, embedded so that the tests also run inside a wasm VM (no file I/O).

pub const V1_30: &str =
    include_str!("../../../testdata/discovery/k8s-1.30-era_resource-v1alpha2/aggregated_v2.json");
pub const V1_33: &str =
    include_str!("../../../testdata/discovery/k8s-1.33-era_resource-v1beta2/aggregated_v2.json");
pub const V1_36: &str =
    include_str!("../../../testdata/discovery/k8s-1.36-era_resource-v1/aggregated_v2.json");
/// A legacy `/apis/<group>` APIGroup document: valid JSON, wrong kind.
pub const LEGACY_API_GROUP: &str =
    include_str!("../../../testdata/discovery/legacy_core-v1/apis__resource.k8s.io.json");

// The module is test-only already; the attribute keeps line-based panic audits honest.
#[cfg(test)]
pub fn parse(text: &str) -> super::ApiGroupDiscoveryList {
    super::ApiGroupDiscoveryList::from_json(text.as_bytes()).unwrap()
}
