//! Which legacy discovery documents the edge composes, from every apiserver's own legacy set.
//!
//! The inputs are the apiservers' own legacy documents, not ones derived from aggregated
//! discovery: a legacy `APIResource` carries `storageVersionHash`, which aggregated discovery
//! lacks, and an apiserver's legacy document is what a client talking to it directly reads.

use serde::{Deserialize, Serialize};

use crate::discovery::{
    ApiGroup, ApiGroupList, ApiResourceList, ApiVersions, merge_api_versions, merge_group, merge_group_list,
    merge_resource_lists, same_api_versions, same_group, same_group_list,
};
use crate::legacy_documents::{LegacyDocumentConfig, LegacyPath};

/// One apiserver's legacy discovery: `/api`, `/apis`, and the `APIResourceList` of every
/// version they name (`/apis/<g>` is the group's entry of `/apis`, as upstream serves it).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LegacySet {
    pub api: ApiVersions,
    pub apis: ApiGroupList,
    /// `/api/<v>` and `/apis/<g>/<v>`, each named by its `groupVersion`.
    pub resource_lists: Vec<ApiResourceList>,
}

impl LegacySet {
    /// The `APIGroup` document `/apis/<group>` answers.
    pub fn group(&self, name: &str) -> Option<ApiGroup> {
        let entry = self.apis.groups.iter().find(|g| g.name == name)?;
        Some(ApiGroup { kind: "APIGroup".to_owned(), api_version: "v1".to_owned(), ..entry.clone() })
    }

    /// The `APIResourceList` of `group`/`version` ("" for core).
    pub fn resource_list(&self, group: &str, version: &str) -> Option<&ApiResourceList> {
        self.resource_lists.iter().find(|list| split_group_version(&list.group_version) == (group, version))
    }
}

/// `apps/v1` → (apps, v1); `v1` → ("", v1).
pub fn split_group_version(group_version: &str) -> (&str, &str) {
    group_version.split_once('/').unwrap_or(("", group_version))
}

/// The composed documents for `servers` (id, legacy set): one per path where at least two
/// apiservers serve it and their documents differ, in a stable order (`/api`, `/apis`, then
/// groups and group/versions by name). `known(group, version)` says whether the routing table
/// has the group (version `None`) or group/version: paths it lacks are left out, since the
/// filter routes those to the pool anyway.
pub fn compose_legacy(
    servers: &[(&str, &LegacySet)],
    known: impl Fn(&str, Option<&str>) -> bool,
) -> Result<Vec<LegacyDocumentConfig>, serde_json::Error> {
    let mut out = Vec::new();
    let mut sorted: Vec<(&str, &LegacySet)> = servers.to_vec();
    sorted.sort_by_key(|(id, _)| *id);
    sorted.dedup_by_key(|(id, _)| *id);

    let versions: Vec<(&str, &ApiVersions)> = sorted.iter().map(|(id, set)| (*id, &set.api)).collect();
    if differ(&versions, same_api_versions) {
        out.push(entry(LegacyPath::Versions, &versions, &merge_api_versions(&versions))?);
    }
    let lists: Vec<(&str, &ApiGroupList)> = sorted.iter().map(|(id, set)| (*id, &set.apis)).collect();
    if differ(&lists, same_group_list) {
        out.push(entry(LegacyPath::GroupList, &lists, &merge_group_list(&lists))?);
    }

    let mut group_names: Vec<&str> =
        sorted.iter().flat_map(|(_, set)| set.apis.groups.iter().map(|g| g.name.as_str())).collect();
    group_names.sort_unstable();
    group_names.dedup();
    for name in group_names.into_iter().filter(|name| known(name, None)) {
        let groups: Vec<(&str, ApiGroup)> =
            sorted.iter().filter_map(|(id, set)| Some((*id, set.group(name)?))).collect();
        let groups: Vec<(&str, &ApiGroup)> = groups.iter().map(|(id, g)| (*id, g)).collect();
        if differ(&groups, same_group) {
            out.push(entry(LegacyPath::Group(name), &groups, &merge_group(&groups))?);
        }
    }

    let mut group_versions: Vec<(&str, &str)> = sorted
        .iter()
        .flat_map(|(_, set)| set.resource_lists.iter().map(|l| split_group_version(&l.group_version)))
        .collect();
    group_versions.sort_unstable();
    group_versions.dedup();
    for (group, version) in group_versions.into_iter().filter(|(g, v)| known(g, Some(v))) {
        let lists: Vec<(&str, &ApiResourceList)> =
            sorted.iter().filter_map(|(id, set)| Some((*id, set.resource_list(group, version)?))).collect();
        if differ(&lists, |a, b| a == b) {
            out.push(entry(LegacyPath::GroupVersion(group, version), &lists, &merge_resource_lists(&lists))?);
        }
    }
    Ok(out)
}

/// At least two documents, and one of them says something another does not.
fn differ<T>(documents: &[(&str, &T)], same: fn(&T, &T) -> bool) -> bool {
    match documents.split_first() {
        Some(((_, first), rest)) if !rest.is_empty() => rest.iter().any(|(_, other)| !same(first, other)),
        _ => false,
    }
}

fn entry<T, D: Serialize>(
    path: LegacyPath<'_>,
    inputs: &[(&str, &T)],
    document: &D,
) -> Result<LegacyDocumentConfig, serde_json::Error> {
    Ok(LegacyDocumentConfig {
        path: path.render(),
        inputs: inputs.iter().map(|(id, _)| (*id).to_owned()).collect(),
        document: serde_json::to_string(document)?,
    })
}
