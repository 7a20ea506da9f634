//! Merged legacy discovery: `/api` (`APIVersions`), `/apis` (`APIGroupList`), `/apis/<g>`
//! (`APIGroup`), `/api/v1` and `/apis/<g>/<v>` (`APIResourceList`) as the union of what every
//! apiserver lists, by the rules of the aggregated merge ([`super::merge_peer_discovery`]):
//!
//! * servers are visited in lexicographic order of their ID, so the result does not depend on
//!   the order of the input slice, and the first ID plays "local": it is "first seen";
//! * lists keyed by name (groups, resources) are unioned; their order is the first server's when
//!   every server names the same entries in the same order, else a merge that keeps every
//!   relative order any server has ([`merge_preserving_relative_order`]);
//! * two servers describing one entry differently: `verbs` become the union, sorted (as the
//!   aggregated merge does); every other field (`kind`, `namespaced`, `singularName`, `group`,
//!   `version`, `shortNames`, `categories`, `storageVersionHash`) is the first-seen server's.
//!   Subresources are separate `resource/sub` entries in legacy discovery and follow the same rule;
//! * a group's versions are ordered by Kubernetes' version priority (GA > beta > alpha, higher
//!   numbers first: upstream's `CompareKubeAwareVersionStrings`), and the preferred version is
//!   the highest-priority of the servers' own preferred versions: each server prefers what its
//!   scheme ranks first, and of those the newest server's choice is the one a server holding
//!   every listed version would make;
//! * `serverAddressByClientCIDRs` names the answering server's own address, which differs from
//!   server to server without saying anything about the API: it is ignored when deciding
//!   whether documents differ, and the first-seen server's is kept.
//!
//! Upstream's legacy discovery is local only (docs/upstream-facts.md, "One API surface"); skewgate merges it because behind one
//! address a client must not see a document lacking something an apiserver there serves.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet};

use super::legacy::{
    ApiGroup, ApiGroupList, ApiResource, ApiResourceList, ApiVersions, GroupVersionForDiscovery,
};
use super::order::merge_preserving_relative_order;

/// The documents of one apiserver, by server ID; the first ID wins first-seen fields.
pub type ByServer<'a, T> = [(&'a str, &'a T)];

/// `/api`: the union of the core group's versions.
pub fn merge_api_versions(servers: &ByServer<'_, ApiVersions>) -> ApiVersions {
    let sorted = by_id(servers);
    let Some(first) = sorted.first().map(|(_, doc)| *doc) else {
        return ApiVersions { kind: super::KIND_API_VERSIONS.to_owned(), ..ApiVersions::default() };
    };
    let lists: Vec<&Vec<String>> = sorted.iter().map(|(_, doc)| &doc.versions).collect();
    let mut versions = ordered_union(&lists);
    versions.sort_by(|a, b| compare_kube_aware_versions(a, b));
    ApiVersions { versions, ..first.clone() }
}

/// `/apis` in the legacy form: every group any server lists, each merged with [`merge_group`].
pub fn merge_group_list(servers: &ByServer<'_, ApiGroupList>) -> ApiGroupList {
    let sorted = by_id(servers);
    let Some(first) = sorted.first().map(|(_, doc)| *doc) else {
        return ApiGroupList {
            kind: super::KIND_API_GROUP_LIST.to_owned(),
            api_version: "v1".to_owned(),
            groups: Vec::new(),
        };
    };
    let name_lists: Vec<Vec<&str>> =
        sorted.iter().map(|(_, doc)| doc.groups.iter().map(|g| g.name.as_str()).collect()).collect();
    let mut by_name: BTreeMap<&str, Vec<(&str, &ApiGroup)>> = BTreeMap::new();
    for (id, doc) in &sorted {
        for group in &doc.groups {
            by_name.entry(group.name.as_str()).or_default().push((id, group));
        }
    }
    let groups = name_order(&name_lists)
        .iter()
        .filter_map(|name| by_name.get(name.as_str()))
        .map(|entries| merge_group(entries))
        .collect();
    ApiGroupList { groups, ..first.clone() }
}

/// `/apis/<g>` (or one entry of `/apis`): the union of the group's versions, by version priority,
/// the preferred version first.
pub fn merge_group(servers: &ByServer<'_, ApiGroup>) -> ApiGroup {
    let sorted = by_id(servers);
    let Some(first) = sorted.first().map(|(_, doc)| *doc) else { return ApiGroup::default() };
    // Servers that agree keep their own order, whatever priorities made it.
    if sorted.iter().all(|(_, group)| same_group(group, first)) {
        return first.clone();
    }
    let mut versions: Vec<GroupVersionForDiscovery> = Vec::new();
    for (_, group) in &sorted {
        for version in &group.versions {
            if !versions.iter().any(|v| v.version == version.version) {
                versions.push(version.clone());
            }
        }
    }
    versions.sort_by(|a, b| compare_kube_aware_versions(&a.version, &b.version));
    let preferred = sorted
        .iter()
        .map(|(_, group)| &group.preferred_version)
        .filter(|p| !p.version.is_empty())
        .min_by(|a, b| compare_kube_aware_versions(&a.version, &b.version))
        .cloned()
        .unwrap_or_else(|| versions.first().cloned().unwrap_or_default());
    if let Some(at) = versions.iter().position(|v| v.version == preferred.version) {
        let entry = versions.remove(at);
        versions.insert(0, entry);
    }
    ApiGroup { versions, preferred_version: preferred, ..first.clone() }
}

/// `/api/v1` or `/apis/<g>/<v>`: the union of the resources (and `resource/sub` entries).
pub fn merge_resource_lists(servers: &ByServer<'_, ApiResourceList>) -> ApiResourceList {
    let sorted = by_id(servers);
    let Some(first) = sorted.first().map(|(_, doc)| *doc) else { return ApiResourceList::default() };
    let name_lists: Vec<Vec<&str>> =
        sorted.iter().map(|(_, doc)| doc.resources.iter().map(|r| r.name.as_str()).collect()).collect();
    let mut by_name: BTreeMap<&str, ApiResource> = BTreeMap::new();
    for (_, doc) in &sorted {
        for resource in &doc.resources {
            match by_name.get_mut(resource.name.as_str()) {
                Some(existing) => merge_resource(existing, resource),
                None => {
                    by_name.insert(&resource.name, resource.clone());
                }
            }
        }
    }
    let resources = name_order(&name_lists).iter().filter_map(|name| by_name.remove(name.as_str())).collect();
    ApiResourceList { resources, ..first.clone() }
}

/// Whether two servers' documents say the same about the API: equal but for the servers' own
/// addresses. Where every server's document is the same, an apiserver answers it as is.
pub fn same_api_versions(a: &ApiVersions, b: &ApiVersions) -> bool {
    (&a.kind, &a.versions) == (&b.kind, &b.versions)
}

/// [`same_api_versions`] for `APIGroup`.
pub fn same_group(a: &ApiGroup, b: &ApiGroup) -> bool {
    (&a.kind, &a.api_version, &a.name, &a.versions, &a.preferred_version)
        == (&b.kind, &b.api_version, &b.name, &b.versions, &b.preferred_version)
}

/// [`same_api_versions`] for `APIGroupList`.
pub fn same_group_list(a: &ApiGroupList, b: &ApiGroupList) -> bool {
    (&a.kind, &a.api_version) == (&b.kind, &b.api_version)
        && a.groups.len() == b.groups.len()
        && a.groups.iter().zip(&b.groups).all(|(x, y)| same_group(x, y))
}

fn merge_resource(existing: &mut ApiResource, incoming: &ApiResource) {
    if existing == incoming {
        return;
    }
    let verbs: BTreeSet<&String> = existing.verbs.iter().chain(&incoming.verbs).collect();
    existing.verbs = verbs.into_iter().cloned().collect();
}

/// Sorted by server ID; a repeated ID keeps its last document, as the aggregated merge does.
fn by_id<'a, T>(servers: &ByServer<'a, T>) -> Vec<(&'a str, &'a T)> {
    let map: BTreeMap<&str, &T> = servers.iter().copied().collect();
    map.into_iter().collect()
}

/// The first list's order if every list is the same, else the relative-order-preserving merge.
fn name_order<S: AsRef<str>>(lists: &[Vec<S>]) -> Vec<String> {
    let same = lists.windows(2).all(|pair| match pair {
        [a, b] => a.iter().map(AsRef::as_ref).eq(b.iter().map(AsRef::as_ref)),
        _ => true,
    });
    match (same, lists.first()) {
        (true, Some(first)) => first.iter().map(|s| s.as_ref().to_owned()).collect(),
        _ => merge_preserving_relative_order(lists),
    }
}

fn ordered_union(lists: &[&Vec<String>]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for item in lists.iter().copied().flatten() {
        if !out.contains(item) {
            out.push(item.clone());
        }
    }
    out
}

/// Kubernetes' version priority as an ordering: `Less` means `a` comes first (ranks higher).
///
/// Upstream's `CompareKubeAwareVersionStrings`: versions shaped `v<major>[(alpha|beta)<minor>]`
/// come before any other string; among them GA before beta before alpha, then the higher major,
/// then the higher minor. Other strings come after, in lexicographic order.
pub fn compare_kube_aware_versions(a: &str, b: &str) -> Ordering {
    match (parse_kube_version(a), parse_kube_version(b)) {
        (Some(x), Some(y)) => y.cmp(&x),
        (Some(_), None) => Ordering::Less,
        (None, Some(_)) => Ordering::Greater,
        (None, None) => a.cmp(b),
    }
}

/// (stability: 2 GA, 1 beta, 0 alpha; major; minor), so that a greater tuple ranks higher.
fn parse_kube_version(version: &str) -> Option<(u8, u64, u64)> {
    let rest = version.strip_prefix('v')?;
    let digits_end = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
    let (major, suffix) = rest.split_at(digits_end);
    let major = parse_number(major)?;
    if suffix.is_empty() {
        return Some((2, major, 0));
    }
    let (stability, minor) = match (suffix.strip_prefix("beta"), suffix.strip_prefix("alpha")) {
        (Some(minor), _) => (1, minor),
        (_, Some(minor)) => (0, minor),
        _ => return None,
    };
    Some((stability, major, parse_number(minor)?))
}

/// Digits only, no leading zero, as upstream's regular expression `[1-9][0-9]*` wants.
fn parse_number(digits: &str) -> Option<u64> {
    let valid = !digits.is_empty() && !digits.starts_with('0') && digits.bytes().all(|b| b.is_ascii_digit());
    valid.then(|| digits.parse().ok()).flatten()
}

#[cfg(test)]
mod tests {

    use super::*;

    fn gv(group: &str, version: &str) -> GroupVersionForDiscovery {
        GroupVersionForDiscovery { group_version: format!("{group}/{version}"), version: version.to_owned() }
    }

    fn group(name: &str, versions: &[&str], preferred: &str) -> ApiGroup {
        ApiGroup {
            name: name.to_owned(),
            versions: versions.iter().map(|v| gv(name, v)).collect(),
            preferred_version: gv(name, preferred),
            ..ApiGroup::default()
        }
    }

    fn resource(name: &str, verbs: &[&str], kind: &str) -> ApiResource {
        ApiResource {
            name: name.to_owned(),
            kind: kind.to_owned(),
            namespaced: true,
            verbs: verbs.iter().map(|v| (*v).to_owned()).collect(),
            ..ApiResource::default()
        }
    }

    fn list(resources: Vec<ApiResource>) -> ApiResourceList {
        ApiResourceList {
            kind: "APIResourceList".into(),
            api_version: "v1".into(),
            group_version: "g/v1".into(),
            resources,
        }
    }

    fn names(list: &ApiResourceList) -> Vec<&str> {
        list.resources.iter().map(|r| r.name.as_str()).collect()
    }

    #[test]
    fn kube_aware_order_is_upstreams() {
        // The order of upstream's TestKubeAwareVersionStrings.
        let expected =
            ["v10", "v2", "v1", "v11beta2", "v10beta3", "v3beta1", "v12alpha1", "v11alpha2", "foo1", "foo10"];
        let mut shuffled = expected;
        shuffled.reverse();
        shuffled.swap(0, 4);
        shuffled.sort_by(|a, b| compare_kube_aware_versions(a, b));
        assert_eq!(shuffled, expected);
        for odd in ["v", "v0", "v01", "v1gamma1", "v1beta", "v1beta0", "1", "V1"] {
            assert_eq!(parse_kube_version(odd), None, "{odd}");
        }
    }

    #[test]
    fn group_versions_are_unioned_by_priority_and_the_newest_preference_wins() {
        let old = group("resource.k8s.io", &["v1beta2", "v1beta1"], "v1beta2");
        let new = group("resource.k8s.io", &["v1"], "v1");
        let merged = merge_group(&[("b", &new), ("a", &old)]);
        let versions: Vec<&str> = merged.versions.iter().map(|v| v.version.as_str()).collect();
        assert_eq!(versions, ["v1", "v1beta2", "v1beta1"]);
        assert_eq!(merged.preferred_version, gv("resource.k8s.io", "v1"));
        assert_eq!(merged, merge_group(&[("a", &old), ("b", &new)]));
    }

    #[test]
    fn a_preference_below_another_listed_version_is_kept_first() {
        // Both servers prefer v1beta1 although v1beta2 exists (as 1.33's resource.k8s.io did):
        // the merged group prefers it too, listed first.
        let a = group("g", &["v1beta1", "v1beta2"], "v1beta1");
        let b = group("g", &["v1beta1", "v1alpha3"], "v1beta1");
        let merged = merge_group(&[("a", &a), ("b", &b)]);
        let versions: Vec<&str> = merged.versions.iter().map(|v| v.version.as_str()).collect();
        assert_eq!(versions, ["v1beta1", "v1beta2", "v1alpha3"]);
        assert_eq!(merged.preferred_version.version, "v1beta1");
    }

    #[test]
    fn resources_are_unioned_with_verbs_merged_and_first_seen_fields() {
        let mut a_claims = resource("deviceclasses", &["get", "list"], "DeviceClass");
        a_claims.storage_version_hash = "AAA".into();
        a_claims.short_names = vec!["dc".into()];
        let mut b_claims = resource("deviceclasses", &["watch", "create", "get"], "DeviceClass");
        b_claims.storage_version_hash = "BBB".into();
        let a = list(vec![a_claims, resource("deviceclasses/status", &["get"], "DeviceClass")]);
        let b = list(vec![resource("resourceclaims", &["get"], "ResourceClaim"), b_claims]);
        let merged = merge_resource_lists(&[("b", &b), ("a", &a)]);
        // b puts resourceclaims before deviceclasses, a deviceclasses before its status.
        assert_eq!(names(&merged), ["resourceclaims", "deviceclasses", "deviceclasses/status"]);
        let dc = &merged.resources[1];
        assert_eq!(dc.verbs, ["create", "get", "list", "watch"]);
        assert_eq!((dc.storage_version_hash.as_str(), dc.short_names.len()), ("AAA", 1));
        assert_eq!(merged, merge_resource_lists(&[("a", &a), ("b", &b)]));
    }

    #[test]
    fn identical_lists_keep_their_order() {
        let a = list(vec![resource("z", &["get"], "Z"), resource("a", &["get"], "A")]);
        let merged = merge_resource_lists(&[("x", &a), ("y", &a)]);
        assert_eq!(merged, a);
    }

    #[test]
    fn group_list_merges_groups_and_keeps_relative_order() {
        let a = ApiGroupList {
            kind: "APIGroupList".into(),
            api_version: "v1".into(),
            groups: vec![group("apps", &["v1"], "v1"), group("resource.k8s.io", &["v1beta1"], "v1beta1")],
        };
        let mut b = a.clone();
        b.groups[1] = group("resource.k8s.io", &["v1", "v1beta1"], "v1");
        b.groups.push(group("lifecycle.k8s.io", &["v1alpha1"], "v1alpha1"));
        let merged = merge_group_list(&[("a", &a), ("b", &b)]);
        let names: Vec<&str> = merged.groups.iter().map(|g| g.name.as_str()).collect();
        assert_eq!(names, ["apps", "resource.k8s.io", "lifecycle.k8s.io"]);
        assert_eq!(merged.groups[1].preferred_version.version, "v1");
        assert_eq!(merged.kind, "APIGroupList");
    }

    #[test]
    fn api_versions_ignore_server_addresses() {
        let address = |a: &str| {
            let mut m = serde_json::Map::new();
            m.insert("clientCIDR".into(), "0.0.0.0/0".into());
            m.insert("serverAddress".into(), a.into());
            m
        };
        let a = ApiVersions {
            kind: "APIVersions".into(),
            versions: vec!["v1".into()],
            server_address_by_client_cidrs: vec![address("10.0.0.1:6443")],
        };
        let b = ApiVersions { server_address_by_client_cidrs: vec![address("10.0.0.2:6443")], ..a.clone() };
        assert!(same_api_versions(&a, &b));
        let merged = merge_api_versions(&[("b", &b), ("a", &a)]);
        assert_eq!(merged, a);
        let c = ApiVersions { versions: vec!["v2".into()], ..b };
        assert!(!same_api_versions(&a, &c));
        assert_eq!(merge_api_versions(&[("a", &a), ("c", &c)]).versions, ["v2", "v1"]);
    }

    #[test]
    fn empty_inputs_give_empty_documents_of_the_right_kind() {
        assert_eq!(merge_group_list(&[]).kind, "APIGroupList");
        assert_eq!(merge_api_versions(&[]).kind, "APIVersions");
        assert!(merge_resource_lists(&[]).resources.is_empty());
    }
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod merge_props {
    use proptest::prelude::*;

    use super::*;

    const VERBS: [&str; 5] = ["create", "delete", "get", "list", "watch"];

    /// Resource lists of several servers that never contradict each other's order: each lists a
    /// subsequence of one hidden order, with verbs of its own.
    fn servers() -> impl Strategy<Value = Vec<ApiResourceList>> {
        (1usize..10).prop_flat_map(|n| {
            let names: Vec<String> = (0..n).map(|i| format!("r{i:02}")).collect();
            let server = prop::collection::vec((any::<bool>(), prop::collection::vec(any::<bool>(), 5)), n);
            (Just(names).prop_shuffle(), prop::collection::vec(server, 1..5)).prop_map(|(order, servers)| {
                servers
                    .into_iter()
                    .map(|picks| ApiResourceList {
                        kind: "APIResourceList".into(),
                        api_version: "v1".into(),
                        group_version: "g/v1".into(),
                        resources: order
                            .iter()
                            .zip(picks)
                            .filter(|(_, (keep, _))| *keep)
                            .map(|(name, (_, verbs))| ApiResource {
                                name: name.clone(),
                                kind: "K".into(),
                                verbs: VERBS
                                    .iter()
                                    .zip(verbs)
                                    .filter(|(_, on)| *on)
                                    .map(|(v, _)| (*v).to_owned())
                                    .collect(),
                                ..ApiResource::default()
                            })
                            .collect(),
                    })
                    .collect()
            })
        })
    }

    fn ids(lists: &[ApiResourceList]) -> Vec<(String, &ApiResourceList)> {
        lists.iter().enumerate().map(|(i, l)| (format!("s{i}"), l)).collect()
    }

    proptest! {
        #[test]
        fn merged_resource_list_covers_every_input_in_its_order(lists in servers()) {
            let owned = ids(&lists);
            let inputs: Vec<(&str, &ApiResourceList)> = owned.iter().map(|(id, l)| (id.as_str(), *l)).collect();
            let merged = merge_resource_lists(&inputs);
            let names: Vec<&str> = merged.resources.iter().map(|r| r.name.as_str()).collect();
            let mut unique = names.clone();
            unique.sort_unstable();
            unique.dedup();
            prop_assert_eq!(unique.len(), names.len(), "duplicates in {:?}", names);
            for (_, list) in &inputs {
                let mut last = None;
                for entry in &list.resources {
                    let at = names.iter().position(|n| *n == entry.name);
                    prop_assert!(at.is_some(), "{} lost", entry.name);
                    prop_assert!(last < at, "order of {} not kept in {:?}", entry.name, names);
                    last = at;
                    let verbs = &merged.resources[at.unwrap_or_default()].verbs;
                    prop_assert!(entry.verbs.iter().all(|v| verbs.contains(v)));
                }
            }
            prop_assert_eq!(merge_resource_lists(&[("x", &merged), ("y", &merged)]), merged.clone());
            let mut reversed = inputs.clone();
            reversed.reverse();
            prop_assert_eq!(merge_resource_lists(&reversed), merged);
        }

        #[test]
        fn merged_group_lists_every_version_with_the_highest_preference_first(
            versions in prop::collection::vec(prop::sample::subsequence(vec!["v1", "v2", "v1beta1", "v1beta2", "v1alpha1", "v2alpha1"], 1..4), 1..4)
        ) {
            let groups: Vec<ApiGroup> = versions
                .iter()
                .map(|vs| {
                    let mut vs = vs.clone();
                    vs.sort_by(|a, b| compare_kube_aware_versions(a, b));
                    let gv = |v: &str| GroupVersionForDiscovery { group_version: format!("g/{v}"), version: v.to_owned() };
                    ApiGroup { name: "g".into(), versions: vs.iter().map(|v| gv(v)).collect(), preferred_version: gv(vs[0]), ..ApiGroup::default() }
                })
                .collect();
            let owned: Vec<(String, &ApiGroup)> = groups.iter().enumerate().map(|(i, g)| (format!("s{i}"), g)).collect();
            let inputs: Vec<(&str, &ApiGroup)> = owned.iter().map(|(id, g)| (id.as_str(), *g)).collect();
            let merged = merge_group(&inputs);
            let all: BTreeSet<&str> = versions.iter().flatten().copied().collect();
            let listed: BTreeSet<&str> = merged.versions.iter().map(|v| v.version.as_str()).collect();
            prop_assert_eq!(listed, all.clone());
            let best = all.iter().copied().min_by(|a, b| compare_kube_aware_versions(a, b));
            prop_assert_eq!(Some(merged.preferred_version.version.as_str()), best);
            prop_assert_eq!(merged.versions.first(), Some(&merged.preferred_version));
            prop_assert_eq!(merge_group(&[("x", &merged), ("y", &merged)]), merged);
        }
    }
}
