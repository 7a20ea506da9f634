//! Aggregated discovery (`apidiscovery.k8s.io/v2`): the typed document, the peer merge that
//! kube-apiserver 1.35+ serves at `/apis`, and its ETag.
//!
//! skewgate has no "local" apiserver of its own, so the merge treats the lexicographically first
//! server ID as local; everything else follows upstream's `peer_aggregated_handler.go`.

pub mod counts;
mod etag;
mod legacy;
mod legacy_merge;
mod merge;
mod model;
mod order;
pub mod protobuf;

#[cfg(test)]
mod fixtures;

pub use etag::etag;
pub use legacy::{
    ApiGroup, ApiGroupList, ApiResource, ApiResourceList, ApiVersions, GroupVersionForDiscovery,
    KIND_API_GROUP, KIND_API_GROUP_LIST, KIND_API_RESOURCE_LIST, KIND_API_VERSIONS, core_group_list,
    group_from_resource_lists,
};
pub use legacy_merge::{
    compare_kube_aware_versions, merge_api_versions, merge_group, merge_group_list, merge_resource_lists,
    same_api_versions, same_group, same_group_list,
};
pub use merge::merge_peer_discovery;
pub use model::{
    ApiGroupDiscovery, ApiGroupDiscoveryList, ApiResourceDiscovery, ApiSubresourceDiscovery,
    ApiVersionDiscovery, DiscoveryError, Freshness, GroupVersionKind, ListMeta, ObjectMeta,
};
pub use order::merge_preserving_relative_order;

/// `kind` of every aggregated discovery list.
pub const KIND_GROUP_DISCOVERY_LIST: &str = "APIGroupDiscoveryList";
/// `apiVersion` of the aggregated discovery documents skewgate serves.
pub const API_VERSION_V2: &str = "apidiscovery.k8s.io/v2";
/// Older `apiVersion` that peers may still send; same shape as v2.
pub const API_VERSION_V2BETA1: &str = "apidiscovery.k8s.io/v2beta1";

/// Media type of the v2 aggregated discovery document in JSON.
pub const MEDIA_TYPE_V2_JSON: &str = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";

/// Accept header for fetching one apiserver's own (un-merged) discovery, as kube-apiserver sends
/// it to its peers: the `nopeer` profile first, then plain v2 for servers that predate profiles,
/// then legacy JSON so that a server without aggregated discovery still answers (and the decode
/// then fails loudly instead of the request failing with 406).
pub const ACCEPT_NOPEER: &str = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList;profile=nopeer,application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json";

#[cfg(test)]
mod tests {

    use super::*;

    #[test]
    fn nopeer_accept_starts_with_the_v2_media_type_and_the_profile() {
        let first = ACCEPT_NOPEER.split(',').next().unwrap_or_default();
        assert_eq!(first, format!("{MEDIA_TYPE_V2_JSON};profile=nopeer"));
        assert!(!ACCEPT_NOPEER.contains(' '));
        assert_eq!(ACCEPT_NOPEER.split(',').count(), 3);
        assert!(ACCEPT_NOPEER.ends_with(",application/json"));
    }
}
