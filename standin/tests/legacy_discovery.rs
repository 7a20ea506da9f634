//! Merged legacy discovery against the documents of a real kube-apiserver v1.36.2, captured at
//! its own API set and at `--emulated-version=1.33 --runtime-config=api/beta=true`
//! (testdata/real-apiserver, unpacked by `standin::captured`): what the edge composes for a
//! 1.33/1.33/1.36 cluster, and the properties of each merge on those inputs.

use std::collections::BTreeSet;

use anyhow::{Context, Result};
use skewgate_core::build::{ClusterNames, ServerApis, build_table, build_table_with};
use skewgate_core::discovery::{
    ApiGroup, ApiGroupDiscoveryList, ApiGroupList, ApiResourceList, ApiVersions, merge_group,
    merge_group_list, merge_resource_lists,
};
use skewgate_core::extensions::Extensions;
use skewgate_core::legacy_build::{LegacySet, compose_legacy};
use skewgate_core::table::{LegacyPath, RoutingTable};
use skewgate_standin::captured::{self, Capture};

fn legacy_set(capture: Capture) -> Result<LegacySet> {
    let docs = captured::documents(capture)?;
    let get = |path: &str| docs.legacy_discovery(path).with_context(|| format!("{path} not captured"));
    let api = ApiVersions::from_json(get("/api")?)?;
    let apis = ApiGroupList::from_json(get("/apis")?)?;
    let mut resource_lists = vec![ApiResourceList::from_json(get("/api/v1")?)?];
    for group in &apis.groups {
        for version in &group.versions {
            resource_lists
                .push(ApiResourceList::from_json(get(&format!("/apis/{}", version.group_version))?)?);
        }
    }
    Ok(LegacySet { api, apis, resource_lists })
}

fn aggregated(capture: Capture) -> Result<(ApiGroupDiscoveryList, ApiGroupDiscoveryList)> {
    let docs = captured::documents(capture)?;
    Ok((
        ApiGroupDiscoveryList::from_json(docs.file("discovery/api.aggregated_v2.json")?)?,
        ApiGroupDiscoveryList::from_json(docs.file("discovery/apis.aggregated_v2.json")?)?,
    ))
}

/// a and b at 1.33 (emulated), c at 1.36.
fn cluster() -> Result<Vec<(&'static str, LegacySet)>> {
    let old = legacy_set(Capture::Emulated133)?;
    Ok(vec![("a", old.clone()), ("b", old), ("c", legacy_set(Capture::Native136)?)])
}

fn refs<'s>(sets: &'s [(&'static str, LegacySet)]) -> Vec<(&'static str, &'s LegacySet)> {
    sets.iter().map(|(id, set)| (*id, set)).collect()
}

fn resource_names(list: &ApiResourceList) -> Vec<&str> {
    list.resources.iter().map(|r| r.name.as_str()).collect()
}

/// Every relative order of `input` is kept in `merged`, and everything in `input` is there.
fn keeps_order(input: &[&str], merged: &[&str]) -> bool {
    let positions: Option<Vec<usize>> =
        input.iter().map(|name| merged.iter().position(|m| m == name)).collect();
    positions.is_some_and(|p| p.windows(2).all(|w| w[0] < w[1]))
}

#[test]
fn captured_group_documents_are_the_group_list_entries() -> Result<()> {
    // `/apis/<g>` is not walked: upstream serves the group's entry of `/apis` there.
    for capture in [Capture::Emulated133, Capture::Native136] {
        let set = legacy_set(capture)?;
        let docs = captured::documents(capture)?;
        for group in &set.apis.groups {
            let captured: ApiGroup = serde_json::from_slice(
                docs.legacy_discovery(&format!("/apis/{}", group.name)).context("group")?,
            )?;
            assert_eq!(set.group(&group.name), Some(captured), "{}", group.name);
        }
    }
    Ok(())
}

#[test]
fn resource_lists_are_unions_that_keep_every_input() -> Result<()> {
    let sets = cluster()?;
    let (old, new) = (&sets[0].1, &sets[2].1);
    let group_versions: BTreeSet<&str> =
        sets.iter().flat_map(|(_, s)| s.resource_lists.iter().map(|l| l.group_version.as_str())).collect();
    let mut differing = 0;
    for gv in group_versions {
        let inputs: Vec<(&str, &ApiResourceList)> = sets
            .iter()
            .filter_map(|(id, s)| Some((*id, s.resource_lists.iter().find(|l| l.group_version == gv)?)))
            .collect();
        let merged = merge_resource_lists(&inputs);
        assert_eq!(merged.group_version, gv);
        for (id, input) in &inputs {
            // ⊇: every entry, with every verb.
            for entry in &input.resources {
                let found = merged.resources.iter().find(|r| r.name == entry.name);
                let found = found.with_context(|| format!("{gv}: {} of {id} lost", entry.name))?;
                assert!(entry.verbs.iter().all(|v| found.verbs.contains(v)), "{gv} {}", entry.name);
                assert_eq!(
                    (&found.kind, found.namespaced),
                    (&entry.kind, entry.namespaced),
                    "{gv} {}",
                    entry.name
                );
            }
            // Order: what each server lists in some order stays in that order.
            assert!(keeps_order(&resource_names(input), &resource_names(&merged)), "{gv}: order of {id}");
            // Absorbing: merging the result with any input again changes nothing.
            assert_eq!(merge_resource_lists(&[("0", &merged), (id, input)]), merged, "{gv}");
        }
        // Idempotent, and independent of the order of the inputs.
        assert_eq!(merge_resource_lists(&[("x", &merged), ("y", &merged)]), merged);
        let mut reversed = inputs.clone();
        reversed.reverse();
        assert_eq!(serde_json::to_string(&merge_resource_lists(&reversed))?, serde_json::to_string(&merged)?);
        differing += usize::from(inputs.iter().any(|(_, l)| **l != merged));
    }
    // resource.k8s.io/v1beta1 and /v1beta2 are served by both, with different resources.
    let claims =
        |set: &LegacySet, gv: &str| set.resource_lists.iter().find(|l| l.group_version == gv).cloned();
    assert_eq!(claims(new, "resource.k8s.io/v1beta1"), None, "1.36.2 has dropped v1beta1");
    assert!(claims(old, "resource.k8s.io/v1beta1").is_some());
    assert!(differing >= 1, "no group/version differs between the captured servers");
    Ok(())
}

#[test]
fn group_list_and_groups_union_with_upstreams_version_priority() -> Result<()> {
    let sets = cluster()?;
    let lists: Vec<(&str, &ApiGroupList)> = sets.iter().map(|(id, s)| (*id, &s.apis)).collect();
    let merged = merge_group_list(&lists);
    let merged_names: Vec<&str> = merged.groups.iter().map(|g| g.name.as_str()).collect();
    for (id, list) in &lists {
        let names: Vec<&str> = list.groups.iter().map(|g| g.name.as_str()).collect();
        assert!(keeps_order(&names, &merged_names), "group order of {id}");
        for group in &list.groups {
            let m = merged.groups.iter().find(|g| g.name == group.name).context("group lost")?;
            assert!(
                group.versions.iter().all(|v| m.versions.contains(v)),
                "{}: versions of {id}",
                group.name
            );
            assert_eq!(m.versions.first(), Some(&m.preferred_version), "{}: preferred first", group.name);
        }
    }
    assert_eq!(merge_group_list(&[("x", &merged), ("y", &merged)]), merged);
    let resource = merged.groups.iter().find(|g| g.name == "resource.k8s.io").context("resource.k8s.io")?;
    let versions: Vec<&str> = resource.versions.iter().map(|v| v.version.as_str()).collect();
    assert_eq!(versions, ["v1", "v1beta2", "v1beta1"]);
    assert_eq!(resource.preferred_version.group_version, "resource.k8s.io/v1");
    // The `/apis/<g>` document is the same group with its type.
    let groups: Vec<(&str, ApiGroup)> =
        sets.iter().filter_map(|(id, s)| Some((*id, s.group("resource.k8s.io")?))).collect();
    let groups: Vec<(&str, &ApiGroup)> = groups.iter().map(|(id, g)| (*id, g)).collect();
    let document = merge_group(&groups);
    assert_eq!((document.kind.as_str(), document.api_version.as_str()), ("APIGroup", "v1"));
    assert_eq!(document.versions, resource.versions);
    Ok(())
}

#[test]
fn only_differing_paths_are_composed_and_the_composition_is_stable() -> Result<()> {
    let sets = cluster()?;
    let everything = |_: &str, _: Option<&str>| true;
    let composed = compose_legacy(&refs(&sets), everything)?;
    let paths: Vec<&str> = composed.iter().map(|d| d.path.as_str()).collect();
    assert!(paths.contains(&"/apis"), "{paths:?}");
    assert!(paths.contains(&"/apis/resource.k8s.io"), "{paths:?}");
    assert!(!paths.contains(&"/api"), "the core group is the same everywhere: {paths:?}");
    assert!(!paths.contains(&"/api/v1"), "{paths:?}");
    // Served by the 1.33 servers only, identically: their own answer is complete.
    assert!(!paths.contains(&"/apis/resource.k8s.io/v1beta2"), "{paths:?}");
    assert!(!paths.contains(&"/apis/apps/v1"), "{paths:?}");
    for document in &composed {
        assert!(document.inputs.len() >= 2, "{}", document.path);
        assert!(LegacyPath::parse(&document.path).is_some(), "{}", document.path);
    }
    // Same inputs in another order, or another slice order: the same bytes.
    let mut shuffled = refs(&sets);
    shuffled.rotate_left(1);
    assert_eq!(compose_legacy(&shuffled, everything)?, composed);
    // Two identical servers compose nothing.
    let twins = [("a", &sets[0].1), ("b", &sets[1].1)];
    assert_eq!(compose_legacy(&twins, everything)?, []);
    Ok(())
}

#[test]
fn the_table_carries_the_composed_documents() -> Result<()> {
    let sets = cluster()?;
    let (old_core, old_apis) = aggregated(Capture::Emulated133)?;
    let (new_core, new_apis) = aggregated(Capture::Native136)?;
    let servers = [
        ServerApis {
            id: "a",
            version: "v1.33",
            documents: vec![&old_core, &old_apis],
            legacy: None,
            features: None,
        },
        ServerApis {
            id: "b",
            version: "v1.33",
            documents: vec![&old_core, &old_apis],
            legacy: None,
            features: None,
        },
        ServerApis {
            id: "c",
            version: "v1.36",
            documents: vec![&new_core, &new_apis],
            legacy: None,
            features: None,
        },
    ];
    let names = ClusterNames::default();
    let started = std::time::Instant::now();
    let without = build_table(&servers, &names)?;
    let plain_build = started.elapsed();
    fn with_sets<'a>(servers: &[ServerApis<'a>], sets: [Option<&'a LegacySet>; 3]) -> Vec<ServerApis<'a>> {
        servers.iter().zip(sets).map(|(s, legacy)| ServerApis { legacy, ..s.clone() }).collect()
    }
    let all = with_sets(&servers, [Some(&sets[0].1), Some(&sets[1].1), Some(&sets[2].1)]);
    let started = std::time::Instant::now();
    let with = build_table_with(&all, &names, &Extensions::default())?;
    let legacy_build = started.elapsed();
    assert_eq!(with, build_table_with(&all, &names, &Extensions::default())?, "deterministic");
    assert_ne!(with.generation, without.generation);
    let (before, after) = (serde_json::to_string(&without)?.len(), serde_json::to_string(&with)?.len());
    let documents: usize = with.legacy_discovery.iter().map(|d| d.document.len()).sum();
    eprintln!(
        "real 1.33/1.33/1.36: table built in {plain_build:?} without, {legacy_build:?} with legacy composition"
    );
    eprintln!(
        "real 1.33/1.33/1.36: table {before} B without legacy documents, {after} B with {} composed ({documents} B of documents): {:?}",
        with.legacy_discovery.len(),
        with.legacy_discovery.iter().map(|d| d.path.as_str()).collect::<Vec<_>>()
    );
    let table = RoutingTable::compile(with.clone())?;
    let (_, group) = table.legacy_discovery().get(LegacyPath::Group("resource.k8s.io")).context("group")?;
    assert_eq!(group.inputs, ["a", "b", "c"]);
    // A server without its legacy set: nothing composed, the apiservers answer as before.
    let partial = with_sets(&servers, [Some(&sets[0].1), Some(&sets[1].1), None]);
    assert!(build_table_with(&partial, &names, &Extensions::default())?.legacy_discovery.is_empty());
    Ok(())
}
