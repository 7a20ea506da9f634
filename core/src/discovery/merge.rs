//! Peer-aggregated `/apis`: the union of every apiserver's aggregated discovery, as
//! kube-apiserver 1.35+ builds it (`mergeResources` in `peer_aggregated_handler.go`).

use std::collections::{BTreeMap, BTreeSet};

use super::model::{
    ApiGroupDiscovery, ApiGroupDiscoveryList, ApiResourceDiscovery, ApiSubresourceDiscovery,
    ApiVersionDiscovery,
};
use super::order::merge_preserving_relative_order;

/// Merges the `/apis` documents of several apiservers, given as (server ID, document).
///
/// Upstream merges "local first, then peers"; skewgate has no local server, so the lexicographically
/// first server ID plays local: its group order is kept when every server lists the same groups,
/// and its metadata, freshness and resource fields win over later servers'. Servers are visited
/// in ID order, so the result does not depend on the order of `servers`.
///
/// * The core group "" is dropped from every input, as upstream's peer cache does.
/// * With one server, its document comes back as is (minus core); with none, an empty v2 list.
/// * Two entries with the same ID: the later one in `servers` replaces the earlier, as upstream's
///   map of peers would.
/// * Otherwise the result is a fresh `apidiscovery.k8s.io/v2` list.
pub fn merge_peer_discovery(servers: &[(&str, &ApiGroupDiscoveryList)]) -> ApiGroupDiscoveryList {
    let lists_by_id: BTreeMap<&str, &ApiGroupDiscoveryList> = servers.iter().copied().collect();
    let Some(local) = lists_by_id.values().next().copied() else {
        return ApiGroupDiscoveryList::v2(Vec::new());
    };
    if lists_by_id.len() == 1 {
        return without_core_group(local);
    }

    let mut merge = GroupMerge::default();
    for list in lists_by_id.values() {
        merge.add_server(list);
    }
    let items = merge.finish(local);
    ApiGroupDiscoveryList::v2(items)
}

fn without_core_group(list: &ApiGroupDiscoveryList) -> ApiGroupDiscoveryList {
    ApiGroupDiscoveryList {
        kind: list.kind.clone(),
        api_version: list.api_version.clone(),
        metadata: list.metadata.clone(),
        items: non_core_groups(list).cloned().collect(),
    }
}

fn non_core_groups(list: &ApiGroupDiscoveryList) -> impl Iterator<Item = &ApiGroupDiscovery> {
    list.items.iter().filter(|group| !group.name().is_empty())
}

#[derive(Default)]
struct GroupMerge {
    groups_by_name: BTreeMap<String, ApiGroupDiscovery>,
    /// Each server's group names, in server-ID order.
    group_names_per_server: Vec<Vec<String>>,
    /// A later server added a version or resource to a group an earlier one had.
    content_changed: bool,
}

impl GroupMerge {
    fn add_server(&mut self, list: &ApiGroupDiscoveryList) {
        let mut group_names = Vec::new();
        for group in non_core_groups(list) {
            match self.groups_by_name.get_mut(group.name()) {
                Some(existing) => self.content_changed |= merge_group(existing, group),
                None => {
                    self.groups_by_name.insert(group.name().to_owned(), group.clone());
                }
            }
            group_names.push(group.name().to_owned());
        }
        self.group_names_per_server.push(group_names);
    }

    fn finish(mut self, local: &ApiGroupDiscoveryList) -> Vec<ApiGroupDiscovery> {
        let local_names = self.group_names_per_server.first().cloned().unwrap_or_default();
        let same_groups_everywhere = self.group_names_per_server.iter().all(|names| *names == local_names);
        if same_groups_everywhere && !self.content_changed {
            return non_core_groups(local).cloned().collect();
        }
        let group_order = if same_groups_everywhere {
            local_names
        } else {
            merge_preserving_relative_order(&self.group_names_per_server)
        };
        group_order.iter().filter_map(|name| self.groups_by_name.remove(name)).collect()
    }
}

/// Merges `incoming` into `existing`; true if `existing` changed. Metadata stays `existing`'s.
fn merge_group(existing: &mut ApiGroupDiscovery, incoming: &ApiGroupDiscovery) -> bool {
    merge_by_name(&mut existing.versions, &incoming.versions, version_name, merge_version)
}

/// Merges `incoming`'s resources into `existing`; true if `existing` changed. Version and
/// freshness stay `existing`'s: a Stale version is never made Current by a peer, nor the reverse.
fn merge_version(existing: &mut ApiVersionDiscovery, incoming: &ApiVersionDiscovery) -> bool {
    merge_by_name(&mut existing.resources, &incoming.resources, resource_name, merge_resource)
}

/// Two servers describing one resource differently: the union of what either allows.
fn merge_resource(existing: &mut ApiResourceDiscovery, incoming: &ApiResourceDiscovery) -> bool {
    if existing == incoming {
        return false;
    }
    *existing = union_of_capabilities(existing, incoming);
    true
}

/// Verbs and subresources from both (sorted, so that the ETag is deterministic); every other
/// field from `first`, unless `first` has no resource name at all.
fn union_of_capabilities(
    first: &ApiResourceDiscovery,
    second: &ApiResourceDiscovery,
) -> ApiResourceDiscovery {
    let descriptive = if first.resource.is_empty() { second } else { first };
    let verbs: BTreeSet<&String> = first.verbs.iter().chain(&second.verbs).collect();
    // Collecting into a map keeps the last value per key: `second` wins a name clash.
    let subresources: BTreeMap<&str, &ApiSubresourceDiscovery> = first
        .subresources
        .iter()
        .chain(&second.subresources)
        .map(|subresource| (subresource.subresource.as_str(), subresource))
        .collect();
    ApiResourceDiscovery {
        verbs: verbs.into_iter().cloned().collect(),
        subresources: subresources.into_values().cloned().collect(),
        ..descriptive.clone()
    }
}

fn version_name(version: &ApiVersionDiscovery) -> &str {
    &version.version
}

fn resource_name(resource: &ApiResourceDiscovery) -> &str {
    &resource.resource
}

/// Union of two lists keyed by name, merging same-named entries with `merge_same_name`.
///
/// `existing` is left untouched (and false returned) when `incoming` names the same entries in
/// the same order and changes none of them. Otherwise the order is `existing`'s when both name
/// lists are equal, else their merge preserving relative order.
fn merge_by_name<T: Clone>(
    existing: &mut Vec<T>,
    incoming: &[T],
    name_of: fn(&T) -> &str,
    merge_same_name: fn(&mut T, &T) -> bool,
) -> bool {
    let existing_names: Vec<String> = existing.iter().map(|item| name_of(item).to_owned()).collect();
    let incoming_names: Vec<String> = incoming.iter().map(|item| name_of(item).to_owned()).collect();
    let mut by_name: BTreeMap<String, T> =
        existing.iter().map(|item| (name_of(item).to_owned(), item.clone())).collect();
    let mut content_changed = false;
    for item in incoming {
        match by_name.get_mut(name_of(item)) {
            Some(current) => content_changed |= merge_same_name(current, item),
            None => {
                by_name.insert(name_of(item).to_owned(), item.clone());
            }
        }
    }

    let same_names = existing_names == incoming_names;
    if same_names && !content_changed {
        return false;
    }
    let order = if same_names {
        existing_names
    } else {
        merge_preserving_relative_order(&[existing_names, incoming_names])
    };
    *existing = order.iter().filter_map(|name| by_name.remove(name)).collect();
    true
}

#[cfg(test)]
mod tests {

    use super::*;
    use crate::discovery::fixtures::{self, V1_30, V1_33, V1_36};
    use crate::discovery::{
        API_VERSION_V2, API_VERSION_V2BETA1, Freshness, GroupVersionKind, ObjectMeta, etag,
    };

    fn resource(name: &str, verbs: &[&str]) -> ApiResourceDiscovery {
        ApiResourceDiscovery {
            resource: name.to_owned(),
            response_kind: Some(GroupVersionKind {
                kind: name.to_uppercase(),
                ..GroupVersionKind::default()
            }),
            scope: "Namespaced".to_owned(),
            singular_resource: name.trim_end_matches('s').to_owned(),
            verbs: verbs.iter().map(|verb| (*verb).to_owned()).collect(),
            ..ApiResourceDiscovery::default()
        }
    }

    fn subresource(name: &str, verbs: &[&str]) -> ApiSubresourceDiscovery {
        ApiSubresourceDiscovery {
            subresource: name.to_owned(),
            verbs: verbs.iter().map(|verb| (*verb).to_owned()).collect(),
            ..ApiSubresourceDiscovery::default()
        }
    }

    fn version(name: &str, resources: Vec<ApiResourceDiscovery>) -> ApiVersionDiscovery {
        ApiVersionDiscovery { version: name.to_owned(), resources, freshness: Some(Freshness::Current) }
    }

    fn group(name: &str, versions: Vec<ApiVersionDiscovery>) -> ApiGroupDiscovery {
        ApiGroupDiscovery {
            metadata: ObjectMeta { name: name.to_owned(), ..ObjectMeta::default() },
            versions,
            ..ApiGroupDiscovery::default()
        }
    }

    /// Groups with one version "v1" holding one resource "things".
    fn simple_groups(names: &[&str]) -> ApiGroupDiscoveryList {
        ApiGroupDiscoveryList::v2(
            names
                .iter()
                .map(|name| group(name, vec![version("v1", vec![resource("things", &["get"])])]))
                .collect(),
        )
    }

    fn core_group() -> ApiGroupDiscovery {
        group("", vec![version("v1", vec![resource("pods", &["get"])])])
    }

    fn group_names(list: &ApiGroupDiscoveryList) -> Vec<&str> {
        list.items.iter().map(ApiGroupDiscovery::name).collect()
    }

    fn version_names<'a>(list: &'a ApiGroupDiscoveryList, group_name: &str) -> Vec<&'a str> {
        find_group(list, group_name).versions.iter().map(|version| version.version.as_str()).collect()
    }

    fn find_group<'a>(list: &'a ApiGroupDiscoveryList, name: &str) -> &'a ApiGroupDiscovery {
        list.items.iter().find(|group| group.name() == name).unwrap()
    }

    fn gvr_set<'a>(lists: &[&'a ApiGroupDiscoveryList]) -> BTreeSet<(&'a str, &'a str, &'a str)> {
        lists.iter().flat_map(|list| list.gvrs()).collect()
    }

    fn only_resource(list: &ApiGroupDiscoveryList) -> &ApiResourceDiscovery {
        &list.items[0].versions[0].resources[0]
    }

    #[test]
    fn merging_1_33_and_1_36_serves_every_gvr_of_both() {
        let older = fixtures::parse(V1_33);
        let newer = fixtures::parse(V1_36);
        let merged = merge_peer_discovery(&[("apiserver-a", &older), ("apiserver-b", &newer)]);
        assert_eq!(gvr_set(&[&merged]), gvr_set(&[&older, &newer]));
        assert_eq!(merged.gvrs().count(), gvr_set(&[&older, &newer]).len());
        assert!(merged.gvrs().any(|gvr| gvr == ("networking.k8s.io", "v1beta1", "servicecidrs")));
        assert!(merged.items.iter().all(|group| !group.name().is_empty()));
        assert_eq!(merged.api_version, API_VERSION_V2);
    }

    #[test]
    fn merged_resource_group_lists_v1_first_then_the_betas_and_alpha() {
        let older = fixtures::parse(V1_33);
        let newer = fixtures::parse(V1_36);
        for servers in [[("a", &older), ("b", &newer)], [("a", &newer), ("b", &older)]] {
            let merged = merge_peer_discovery(&servers);
            assert_eq!(version_names(&merged, "resource.k8s.io"), ["v1", "v1beta2", "v1beta1", "v1alpha3"]);
            assert_eq!(version_names(&merged, "storage.k8s.io"), ["v1", "v1beta1", "v1alpha1"]);
        }
    }

    #[test]
    fn merged_group_order_extends_the_older_order_with_the_new_group() {
        let older = fixtures::parse(V1_33);
        let newer = fixtures::parse(V1_36);
        let merged = merge_peer_discovery(&[("a", &older), ("b", &newer)]);
        assert_eq!(group_names(&merged), group_names(&newer));
        assert_eq!(group_names(&merged).last(), Some(&"lifecycle.k8s.io"));
    }

    #[test]
    fn with_two_complete_but_conflicting_group_orders_the_first_server_id_wins() {
        // 1.30 lists resource.k8s.io after internal.apiserver.k8s.io, 1.33 before
        // flowcontrol: a cycle that the "complete list" shortcut resolves.
        let v1_30 = fixtures::parse(V1_30);
        let v1_33 = fixtures::parse(V1_33);
        let merged = merge_peer_discovery(&[("b", &v1_30), ("a", &v1_33)]);
        assert_eq!(group_names(&merged), group_names(&v1_33));
        let merged = merge_peer_discovery(&[("a", &v1_30), ("b", &v1_33)]);
        assert_eq!(group_names(&merged), group_names(&v1_30));
    }

    #[test]
    fn merge_does_not_depend_on_the_order_of_the_input_slice() {
        let v1_30 = fixtures::parse(V1_30);
        let v1_33 = fixtures::parse(V1_33);
        let v1_36 = fixtures::parse(V1_36);
        let reference = merge_peer_discovery(&[("x", &v1_30), ("y", &v1_33), ("z", &v1_36)]);
        for servers in [
            [("z", &v1_36), ("y", &v1_33), ("x", &v1_30)],
            [("y", &v1_33), ("x", &v1_30), ("z", &v1_36)],
            [("z", &v1_36), ("x", &v1_30), ("y", &v1_33)],
        ] {
            let merged = merge_peer_discovery(&servers);
            assert_eq!(merged, reference);
            assert_eq!(etag(&merged), etag(&reference));
        }
        assert_eq!(gvr_set(&[&reference]), gvr_set(&[&v1_30, &v1_33, &v1_36]));
    }

    #[test]
    fn merge_is_deterministic() {
        let older = fixtures::parse(V1_33);
        let newer = fixtures::parse(V1_36);
        let first = merge_peer_discovery(&[("a", &older), ("b", &newer)]);
        let second = merge_peer_discovery(&[("a", &older), ("b", &newer)]);
        assert_eq!(serde_json::to_string(&first).unwrap(), serde_json::to_string(&second).unwrap());
    }

    #[test]
    fn core_group_is_dropped_from_every_input() {
        let mut with_core = simple_groups(&["apps", "batch"]);
        with_core.items.insert(0, core_group());
        let other = simple_groups(&["apps"]);
        let merged = merge_peer_discovery(&[("a", &with_core), ("b", &other)]);
        assert_eq!(group_names(&merged), ["apps", "batch"]);
        let alone = merge_peer_discovery(&[("a", &with_core)]);
        assert_eq!(group_names(&alone), ["apps", "batch"]);
    }

    #[test]
    fn a_single_server_is_returned_unchanged() {
        let mut beta = fixtures::parse(V1_33);
        beta.api_version = API_VERSION_V2BETA1.to_owned();
        let merged = merge_peer_discovery(&[("only", &beta)]);
        assert_eq!(merged, beta);
    }

    #[test]
    fn no_server_gives_an_empty_v2_list() {
        let merged = merge_peer_discovery(&[]);
        assert_eq!(merged, ApiGroupDiscoveryList::v2(Vec::new()));
    }

    #[test]
    fn identical_servers_give_the_local_document() {
        let document = fixtures::parse(V1_36);
        let merged = merge_peer_discovery(&[("a", &document), ("b", &document)]);
        assert_eq!(merged.items, document.items);
        assert_eq!(etag(&merged), etag(&document));
    }

    #[test]
    fn the_same_id_twice_keeps_the_later_entry() {
        let first = simple_groups(&["apps"]);
        let second = simple_groups(&["batch"]);
        let merged = merge_peer_discovery(&[("a", &first), ("a", &second)]);
        assert_eq!(group_names(&merged), ["batch"]);
    }

    #[test]
    fn groups_keep_every_server_order_and_break_ties_lexicographically() {
        let a = simple_groups(&["g1", "g3"]);
        let b = simple_groups(&["g2", "g3"]);
        let merged = merge_peer_discovery(&[("a", &a), ("b", &b)]);
        assert_eq!(group_names(&merged), ["g1", "g2", "g3"]);

        let a = simple_groups(&["z", "m"]);
        let b = simple_groups(&["b", "m"]);
        let merged = merge_peer_discovery(&[("a", &a), ("b", &b)]);
        assert_eq!(group_names(&merged), ["b", "z", "m"]);
    }

    #[test]
    fn same_group_names_keep_the_local_order_while_content_merges() {
        let a = simple_groups(&["zeta", "alpha"]);
        let mut b = simple_groups(&["zeta", "alpha"]);
        b.items[0].versions.push(version("v1beta1", vec![resource("things", &["get"])]));
        let merged = merge_peer_discovery(&[("a", &a), ("b", &b)]);
        assert_eq!(group_names(&merged), ["zeta", "alpha"]);
        assert_eq!(version_names(&merged, "zeta"), ["v1", "v1beta1"]);
    }

    #[test]
    fn contradicting_group_orders_without_a_complete_list_do_not_hang() {
        let a = simple_groups(&["x", "y", "w"]);
        let b = simple_groups(&["y", "x", "v"]);
        let merged = merge_peer_discovery(&[("a", &a), ("b", &b)]);
        assert_eq!(group_names(&merged), ["v", "w", "x", "y"]);
    }

    #[test]
    fn versions_and_resources_merge_preserving_relative_order() {
        let a = ApiGroupDiscoveryList::v2(vec![group(
            "apps",
            vec![
                version("v1", vec![resource("pods", &["get"]), resource("services", &["get"])]),
                version("v1beta1", vec![resource("pods", &["get"])]),
            ],
        )]);
        let b = ApiGroupDiscoveryList::v2(vec![group(
            "apps",
            vec![
                version("v2", vec![resource("pods", &["get"])]),
                version("v1", vec![resource("configmaps", &["get"]), resource("services", &["get"])]),
            ],
        )]);
        let merged = merge_peer_discovery(&[("a", &a), ("b", &b)]);
        assert_eq!(version_names(&merged, "apps"), ["v2", "v1", "v1beta1"]);
        let v1_resources: Vec<&str> =
            merged.items[0].versions[1].resources.iter().map(|resource| resource.resource.as_str()).collect();
        assert_eq!(v1_resources, ["configmaps", "pods", "services"]);
    }

    #[test]
    fn differing_resources_get_the_sorted_union_of_verbs() {
        let a = ApiGroupDiscoveryList::v2(vec![group(
            "apps",
            vec![version("v1", vec![resource("deployments", &["list", "get"])])],
        )]);
        let b = ApiGroupDiscoveryList::v2(vec![group(
            "apps",
            vec![version("v1", vec![resource("deployments", &["watch", "get", "create"])])],
        )]);
        let merged = merge_peer_discovery(&[("a", &a), ("b", &b)]);
        assert_eq!(only_resource(&merged).verbs, ["create", "get", "list", "watch"]);
    }

    #[test]
    fn equal_resources_are_left_as_the_first_server_wrote_them() {
        let a = ApiGroupDiscoveryList::v2(vec![group(
            "apps",
            vec![version("v1", vec![resource("deployments", &["list", "get"])])],
        )]);
        let merged = merge_peer_discovery(&[("a", &a), ("b", &a.clone())]);
        assert_eq!(only_resource(&merged).verbs, ["list", "get"]);
    }

    #[test]
    fn subresources_are_united_by_name_later_server_winning_and_sorted() {
        let mut in_a = resource("deployments", &["get"]);
        in_a.subresources = vec![subresource("status", &["get"])];
        let mut in_b = resource("deployments", &["get"]);
        in_b.subresources = vec![subresource("status", &["get", "patch"]), subresource("scale", &["get"])];
        let a = ApiGroupDiscoveryList::v2(vec![group("apps", vec![version("v1", vec![in_a])])]);
        let b = ApiGroupDiscoveryList::v2(vec![group("apps", vec![version("v1", vec![in_b])])]);
        let merged = merge_peer_discovery(&[("a", &a), ("b", &b)]);
        assert_eq!(
            only_resource(&merged).subresources,
            [subresource("scale", &["get"]), subresource("status", &["get", "patch"])]
        );
    }

    #[test]
    fn other_resource_fields_come_from_the_first_server() {
        let mut in_a = resource("deployments", &["get"]);
        in_a.short_names = vec!["deploy".to_owned()];
        let mut in_b = resource("deployments", &["list"]);
        in_b.singular_resource = "other".to_owned();
        in_b.scope = "Cluster".to_owned();
        let a = ApiGroupDiscoveryList::v2(vec![group("apps", vec![version("v1", vec![in_a])])]);
        let b = ApiGroupDiscoveryList::v2(vec![group("apps", vec![version("v1", vec![in_b])])]);
        let merged = merge_peer_discovery(&[("a", &a), ("b", &b)]);
        let merged_resource = only_resource(&merged);
        assert_eq!(merged_resource.singular_resource, "deployment");
        assert_eq!(merged_resource.scope, "Namespaced");
        assert_eq!(merged_resource.short_names, ["deploy"]);
        let merged = merge_peer_discovery(&[("b", &a), ("a", &b)]);
        assert_eq!(only_resource(&merged).singular_resource, "other");
    }

    #[test]
    fn freshness_is_the_first_seen_and_never_upgraded() {
        let mut stale = ApiGroupDiscoveryList::v2(vec![group(
            "apps",
            vec![version("v1", vec![resource("deployments", &["get"])])],
        )]);
        stale.items[0].versions[0].freshness = Some(Freshness::Stale);
        let current = ApiGroupDiscoveryList::v2(vec![group(
            "apps",
            vec![version("v1", vec![resource("deployments", &["get"]), resource("replicasets", &["get"])])],
        )]);

        let merged = merge_peer_discovery(&[("a", &stale), ("b", &current)]);
        assert_eq!(merged.items[0].versions[0].freshness, Some(Freshness::Stale));
        assert_eq!(merged.items[0].versions[0].resources.len(), 2);

        let merged = merge_peer_discovery(&[("b", &stale), ("a", &current)]);
        assert_eq!(merged.items[0].versions[0].freshness, Some(Freshness::Current));
    }

    #[test]
    fn a_version_only_one_server_has_is_copied_as_is() {
        let a = simple_groups(&["apps"]);
        let mut b = simple_groups(&["apps"]);
        let mut stale_beta = version("v1beta1", vec![resource("widgets", &["get"])]);
        stale_beta.freshness = Some(Freshness::Stale);
        b.items[0].versions = vec![stale_beta.clone()];
        let merged = merge_peer_discovery(&[("a", &a), ("b", &b)]);
        assert_eq!(merged.items[0].versions[1], stale_beta);
    }

    #[test]
    fn group_metadata_is_the_first_seen() {
        let mut a = simple_groups(&["apps"]);
        a.items[0].metadata.creation_timestamp = Some(serde_json::Value::Null);
        let mut b = simple_groups(&["apps"]);
        b.items[0].versions.push(version("v2", vec![resource("things", &["get"])]));
        let merged = merge_peer_discovery(&[("a", &a), ("b", &b)]);
        assert_eq!(merged.items[0].metadata, a.items[0].metadata);
        assert_eq!(merged.items[0].versions.len(), 2);
        let merged = merge_peer_discovery(&[("b", &a), ("a", &b)]);
        assert_eq!(merged.items[0].metadata.creation_timestamp, None);
    }

    #[test]
    fn the_merged_document_has_its_own_etag() {
        let older = fixtures::parse(V1_33);
        let newer = fixtures::parse(V1_36);
        let merged = merge_peer_discovery(&[("a", &older), ("b", &newer)]);
        assert_ne!(etag(&merged), etag(&older));
        assert_ne!(etag(&merged), etag(&newer));
    }
}
