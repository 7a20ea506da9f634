//! Legacy (unaggregated) discovery, and its conversion to the aggregated form.
//!
//! An apiserver without aggregated discovery still describes itself with `APIGroupList` at
//! `/apis` and one `APIResourceList` per group-version; the core group is always described by
//! the `APIResourceList` at `/api/v1`. Converting these into [`ApiGroupDiscovery`] lets such
//! servers go through the same table build and peer merge as everyone else. The conversion is
//! upstream's `ConvertGroupVersionIntoToDiscovery` (`endpoints/installer.go`).

use std::collections::HashMap;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::model::{
    ApiGroupDiscovery, ApiGroupDiscoveryList, ApiResourceDiscovery, ApiSubresourceDiscovery,
    ApiVersionDiscovery, DiscoveryError, Freshness, GroupVersionKind, ObjectMeta, go_struct,
};

/// `kind` of `/api/v1` and `/apis/<group>/<version>`.
pub const KIND_API_RESOURCE_LIST: &str = "APIResourceList";
/// `kind` of the legacy `/apis`.
pub const KIND_API_GROUP_LIST: &str = "APIGroupList";
/// `kind` of the legacy `/apis/<group>`.
pub const KIND_API_GROUP: &str = "APIGroup";
/// `kind` of the legacy `/api`.
pub const KIND_API_VERSIONS: &str = "APIVersions";

const SCOPE_NAMESPACED: &str = "Namespaced";
const SCOPE_CLUSTER: &str = "Cluster";

go_struct! {
    /// `metav1.APIResourceList`: the resources of one group-version, subresources as `resource/sub`.
    #[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct ApiResourceList {
        #[serde(skip_serializing_if = "String::is_empty")]
        pub kind: String,
        #[serde(skip_serializing_if = "String::is_empty")]
        pub api_version: String,
        /// `v1` for the core group, `<group>/<version>` for the others.
        pub group_version: String,
        pub resources: Vec<ApiResource>,
    }
}

go_struct! {
    /// `metav1.APIResource`.
    #[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct ApiResource {
        /// Plural name; `resource/sub` for a subresource.
        pub name: String,
        /// "" for subresources.
        pub singular_name: String,
        pub namespaced: bool,
        /// Group of `kind` when it is not the containing group (e.g. `pods/eviction` → `policy`).
        #[serde(skip_serializing_if = "String::is_empty")]
        pub group: String,
        #[serde(skip_serializing_if = "String::is_empty")]
        pub version: String,
        pub kind: String,
        pub verbs: Vec<String>,
        #[serde(skip_serializing_if = "Vec::is_empty")]
        pub short_names: Vec<String>,
        #[serde(skip_serializing_if = "Vec::is_empty")]
        pub categories: Vec<String>,
        #[serde(skip_serializing_if = "String::is_empty")]
        pub storage_version_hash: String,
    }
}

go_struct! {
    /// `metav1.APIGroupList`: the legacy `/apis`.
    #[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct ApiGroupList {
        #[serde(skip_serializing_if = "String::is_empty")]
        pub kind: String,
        #[serde(skip_serializing_if = "String::is_empty")]
        pub api_version: String,
        pub groups: Vec<ApiGroup>,
    }
}

go_struct! {
    /// `metav1.APIGroup`: one entry of `/apis`, and the document at `/apis/<group>`.
    #[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct ApiGroup {
        #[serde(skip_serializing_if = "String::is_empty")]
        pub kind: String,
        #[serde(skip_serializing_if = "String::is_empty")]
        pub api_version: String,
        pub name: String,
        pub versions: Vec<GroupVersionForDiscovery>,
        pub preferred_version: GroupVersionForDiscovery,
        #[serde(rename = "serverAddressByClientCIDRs", skip_serializing_if = "Vec::is_empty")]
        pub server_address_by_client_cidrs: Vec<Map<String, Value>>,
    }
}

go_struct! {
    /// `metav1.GroupVersionForDiscovery`.
    #[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct GroupVersionForDiscovery {
        pub group_version: String,
        pub version: String,
    }
}

go_struct! {
    /// `metav1.APIVersions`: the legacy `/api`, naming the core group's versions.
    #[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct ApiVersions {
        #[serde(skip_serializing_if = "String::is_empty")]
        pub kind: String,
        pub versions: Vec<String>,
        #[serde(rename = "serverAddressByClientCIDRs", skip_serializing_if = "Vec::is_empty")]
        pub server_address_by_client_cidrs: Vec<Map<String, Value>>,
    }
}

impl ApiResourceList {
    /// Decodes `/api/v1` or `/apis/<group>/<version>`.
    pub fn from_json(bytes: &[u8]) -> Result<Self, DiscoveryError> {
        decode(bytes, KIND_API_RESOURCE_LIST, |list: &Self| &list.kind)
    }
}

impl ApiGroupList {
    /// Decodes the legacy `/apis`.
    pub fn from_json(bytes: &[u8]) -> Result<Self, DiscoveryError> {
        decode(bytes, KIND_API_GROUP_LIST, |list: &Self| &list.kind)
    }
}

impl ApiVersions {
    /// Decodes the legacy `/api`.
    pub fn from_json(bytes: &[u8]) -> Result<Self, DiscoveryError> {
        decode(bytes, KIND_API_VERSIONS, |list: &Self| &list.kind)
    }
}

impl ApiGroup {
    /// Decodes the legacy `/apis/<group>`.
    pub fn from_json(bytes: &[u8]) -> Result<Self, DiscoveryError> {
        decode(bytes, KIND_API_GROUP, |group: &Self| &group.kind)
    }

    /// The group's versions, preferred first, then the others in listed order: the order
    /// [`group_from_resource_lists`] wants its lists in, since aggregated discovery has no
    /// separate "preferred" field.
    pub fn versions_by_preference(&self) -> Vec<&str> {
        let preferred = self.preferred_version.version.as_str();
        let listed = self.versions.iter().map(|v| v.version.as_str());
        let mut ordered: Vec<&str> = Vec::with_capacity(self.versions.len() + 1);
        if !preferred.is_empty() {
            ordered.push(preferred);
        }
        for version in listed {
            if !ordered.contains(&version) {
                ordered.push(version);
            }
        }
        ordered
    }
}

/// One aggregated group from the `APIResourceList`s of its versions, given in preference order.
///
/// Every list must belong to `group` ("" is the core group, whose lists say just `v1`) and name a
/// distinct version. Each version comes out `Current`: a server that answered the list has it.
pub fn group_from_resource_lists(
    group: &str,
    lists: &[ApiResourceList],
) -> Result<ApiGroupDiscovery, DiscoveryError> {
    let mut versions: Vec<ApiVersionDiscovery> = Vec::with_capacity(lists.len());
    for (index, list) in lists.iter().enumerate() {
        let version = version_in_group(group, &list.group_version).ok_or_else(|| {
            DiscoveryError::WrongShape(format!(
                "APIResourceList {index} has groupVersion {:?}, not a version of group {group:?}",
                list.group_version
            ))
        })?;
        if versions.iter().any(|v| v.version == version) {
            return Err(DiscoveryError::WrongShape(format!(
                "APIResourceList {index}: version {version:?} of group {group:?} is listed twice"
            )));
        }
        versions.push(version_discovery(version, &list.resources));
    }
    Ok(named_group(group, versions))
}

/// The aggregated `/api` document built from the legacy `/api/v1`: one group, named "".
///
/// `api_v1` is trusted to be what `/api/v1` answered, so its `groupVersion` is the version as is;
/// use [`group_from_resource_lists`] with group "" to have it checked instead.
pub fn core_group_list(api_v1: &ApiResourceList) -> ApiGroupDiscoveryList {
    let version = version_discovery(&api_v1.group_version, &api_v1.resources);
    ApiGroupDiscoveryList::v2(vec![named_group("", vec![version])])
}

fn named_group(name: &str, versions: Vec<ApiVersionDiscovery>) -> ApiGroupDiscovery {
    ApiGroupDiscovery {
        metadata: ObjectMeta { name: name.to_owned(), ..ObjectMeta::default() },
        versions,
        ..ApiGroupDiscovery::default()
    }
}

/// The version part of `group_version` if it belongs to `group`.
fn version_in_group<'a>(group: &str, group_version: &'a str) -> Option<&'a str> {
    let version = if group.is_empty() {
        group_version
    } else {
        group_version.strip_prefix(group)?.strip_prefix('/')?
    };
    (!version.is_empty() && !version.contains('/')).then_some(version)
}

fn version_discovery(version: &str, entries: &[ApiResource]) -> ApiVersionDiscovery {
    ApiVersionDiscovery {
        version: version.to_owned(),
        resources: resources_with_subresources(entries),
        freshness: Some(Freshness::Current),
    }
}

/// Top-level entries become resources in listed order; `resource/sub` entries are attached to
/// their parent afterwards, so a subresource listed before its parent still finds it.
fn resources_with_subresources(entries: &[ApiResource]) -> Vec<ApiResourceDiscovery> {
    let mut resources: Vec<ApiResourceDiscovery> = Vec::new();
    let mut index_of: HashMap<&str, usize> = HashMap::new();
    for entry in entries.iter().filter(|e| !e.name.contains('/')) {
        index_of.insert(&entry.name, resources.len());
        resources.push(top_level_resource(entry));
    }
    for entry in entries {
        let Some((parent, subresource)) = entry.name.split_once('/') else {
            continue;
        };
        let index = *index_of.entry(parent).or_insert_with(|| {
            resources.push(parent_placeholder(parent, entry.namespaced));
            resources.len() - 1
        });
        // A subresource whose scope differs from its parent's is a server bug that upstream
        // refuses; the aggregated form has no per-subresource scope, and dropping the whole
        // server's discovery over it would stop routing to it, so the parent's scope stands.
        if let Some(resource) = resources.get_mut(index) {
            resource.subresources.push(subresource_of(subresource, entry));
        }
    }
    resources
}

fn top_level_resource(entry: &ApiResource) -> ApiResourceDiscovery {
    ApiResourceDiscovery {
        resource: entry.name.clone(),
        response_kind: Some(kind_of(entry)),
        scope: scope(entry.namespaced).to_owned(),
        singular_resource: entry.singular_name.clone(),
        verbs: entry.verbs.clone(),
        short_names: entry.short_names.clone(),
        categories: entry.categories.clone(),
        subresources: Vec::new(),
    }
}

/// Upstream invents the parent of an orphan subresource (an APIService may serve subresources
/// only); its empty responseKind keeps client-go 0.26.0-0.26.3 from dereferencing nil.
fn parent_placeholder(name: &str, namespaced: bool) -> ApiResourceDiscovery {
    ApiResourceDiscovery {
        resource: name.to_owned(),
        response_kind: Some(GroupVersionKind::default()),
        scope: scope(namespaced).to_owned(),
        ..ApiResourceDiscovery::default()
    }
}

fn subresource_of(name: &str, entry: &ApiResource) -> ApiSubresourceDiscovery {
    let response_kind = if entry.kind.is_empty() { GroupVersionKind::default() } else { kind_of(entry) };
    ApiSubresourceDiscovery {
        subresource: name.to_owned(),
        response_kind: Some(response_kind),
        accepted_types: Vec::new(),
        verbs: entry.verbs.clone(),
    }
}

/// Empty group and version keep meaning "the containing group-version", as in the legacy entry.
fn kind_of(entry: &ApiResource) -> GroupVersionKind {
    GroupVersionKind { group: entry.group.clone(), version: entry.version.clone(), kind: entry.kind.clone() }
}

fn scope(namespaced: bool) -> &'static str {
    if namespaced { SCOPE_NAMESPACED } else { SCOPE_CLUSTER }
}

/// Decodes a legacy document of kind `expected`; a missing kind is tolerated (nothing else
/// would be at these paths), another kind is not.
fn decode<T: DeserializeOwned>(
    bytes: &[u8],
    expected: &str,
    kind: fn(&T) -> &String,
) -> Result<T, DiscoveryError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(DiscoveryError::Empty);
    }
    match serde_json::from_slice::<T>(bytes) {
        // serde also fills a struct from a JSON array, which Go never does.
        Ok(_) if bytes.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') => {
            Err(DiscoveryError::WrongShape(format!("expected a JSON object ({expected}) at the top level")))
        }
        Ok(document) => {
            check_kind(kind(&document), expected)?;
            Ok(document)
        }
        Err(error) => {
            // A Status or another discovery document: its kind says more than a type error.
            if let Ok(object) = serde_json::from_slice::<Map<String, Value>>(bytes) {
                let found = match object.get("kind") {
                    Some(Value::String(text)) => text.clone(),
                    None | Some(Value::Null) => String::new(),
                    Some(other) => other.to_string(),
                };
                check_kind(&found, expected)?;
            }
            Err(decode_error(&error))
        }
    }
}

fn check_kind(found: &str, expected: &str) -> Result<(), DiscoveryError> {
    if found.is_empty() || found == expected {
        Ok(())
    } else {
        Err(DiscoveryError::WrongKind(found.to_owned()))
    }
}

fn decode_error(error: &serde_json::Error) -> DiscoveryError {
    let message = error.to_string();
    match error.classify() {
        serde_json::error::Category::Eof => DiscoveryError::Truncated(message),
        serde_json::error::Category::Data => DiscoveryError::WrongShape(message),
        serde_json::error::Category::Syntax | serde_json::error::Category::Io => {
            DiscoveryError::NotJson(message)
        }
    }
}

#[cfg(test)]
mod tests {

    use super::*;

    const API_V1: &str = include_str!("../../../testdata/discovery/legacy_core-v1/api__v1.json");
    const API: &str = include_str!("../../../testdata/discovery/legacy_core-v1/api.json");
    const API_GROUP: &str =
        include_str!("../../../testdata/discovery/legacy_core-v1/apis__resource.k8s.io.json");

    fn api_v1() -> ApiResourceList {
        ApiResourceList::from_json(API_V1.as_bytes()).unwrap()
    }

    fn find<'a>(version: &'a ApiVersionDiscovery, name: &str) -> &'a ApiResourceDiscovery {
        version.resources.iter().find(|r| r.resource == name).unwrap()
    }

    fn subresource_names(resource: &ApiResourceDiscovery) -> Vec<&str> {
        resource.subresources.iter().map(|s| s.subresource.as_str()).collect()
    }

    fn entry(name: &str, namespaced: bool, kind: &str) -> ApiResource {
        ApiResource {
            name: name.to_owned(),
            namespaced,
            kind: kind.to_owned(),
            verbs: vec!["get".to_owned()],
            ..ApiResource::default()
        }
    }

    fn list(group_version: &str, resources: Vec<ApiResource>) -> ApiResourceList {
        ApiResourceList { group_version: group_version.to_owned(), resources, ..ApiResourceList::default() }
    }

    #[test]
    fn core_fixture_becomes_group_core_v1() {
        let document = core_group_list(&api_v1());
        assert_eq!(document.kind, "APIGroupDiscoveryList");
        assert_eq!(document.api_version, "apidiscovery.k8s.io/v2");
        assert_eq!(document.items.len(), 1);
        let core = &document.items[0];
        assert_eq!(core.name(), "");
        assert_eq!(core.versions.len(), 1);
        assert_eq!(core.versions[0].version, "v1");
        assert_eq!(core.versions[0].freshness, Some(Freshness::Current));
        // 39 entries, 17 of them top-level.
        assert_eq!(core.versions[0].resources.len(), 17);
        assert!(document.gvrs().any(|gvr| gvr == ("", "v1", "bindings")));
        assert!(document.gvrs().all(|(_, _, resource)| !resource.contains('/')));
    }

    #[test]
    fn pods_carry_their_subresources_in_listed_order() {
        let document = core_group_list(&api_v1());
        let pods = find(&document.items[0].versions[0], "pods");
        assert_eq!(
            subresource_names(pods),
            [
                "attach",
                "binding",
                "checkpoint",
                "ephemeralcontainers",
                "eviction",
                "exec",
                "log",
                "portforward",
                "proxy",
                "status"
            ]
        );
        assert_eq!(pods.scope, "Namespaced");
        assert_eq!(pods.singular_resource, "pod");
        assert_eq!(pods.short_names, ["po"]);
        assert_eq!(pods.categories, ["all"]);
        assert_eq!(pods.response_kind, Some(GroupVersionKind { kind: "Pod".into(), ..Default::default() }));
        let eviction = pods.subresources.iter().find(|s| s.subresource == "eviction").unwrap();
        assert_eq!(
            eviction.response_kind,
            Some(GroupVersionKind { group: "policy".into(), version: "v1".into(), kind: "Eviction".into() })
        );
        assert_eq!(eviction.verbs, ["create"]);
        let log = pods.subresources.iter().find(|s| s.subresource == "log").unwrap();
        assert_eq!(log.response_kind, Some(GroupVersionKind { kind: "Pod".into(), ..Default::default() }));
    }

    #[test]
    fn cluster_scoped_resources_and_foreign_kinds() {
        let document = core_group_list(&api_v1());
        let v1 = &document.items[0].versions[0];
        let namespaces = find(v1, "namespaces");
        assert_eq!(namespaces.scope, "Cluster");
        assert_eq!(subresource_names(namespaces), ["finalize", "status"]);
        let rc = find(v1, "replicationcontrollers");
        let scale = rc.subresources.iter().find(|s| s.subresource == "scale").unwrap();
        assert_eq!(scale.response_kind.as_ref().map(|k| k.group.as_str()), Some("autoscaling"));
        let bindings = find(v1, "bindings");
        assert_eq!(bindings.verbs, ["create"]);
        assert!(bindings.subresources.is_empty());
        let token = find(v1, "serviceaccounts").subresources.iter().find(|s| s.subresource == "token");
        assert_eq!(
            token.and_then(|t| t.response_kind.as_ref()).map(|k| k.kind.as_str()),
            Some("TokenRequest")
        );
    }

    #[test]
    fn converted_core_serializes_like_an_aggregated_document() {
        let document = core_group_list(&api_v1());
        let text = serde_json::to_string(&document).unwrap();
        let again = ApiGroupDiscoveryList::from_json(text.as_bytes()).unwrap();
        assert_eq!(again, document);
        assert!(text.contains(r#"{"resource":"bindings","responseKind":{"group":"","version":"","kind":"Binding"},"scope":"Namespaced","singularResource":"binding","verbs":["create"]}"#), "{text}");
    }

    #[test]
    fn group_versions_keep_the_given_order() {
        let lists = [
            list("resource.k8s.io/v1beta1", vec![entry("deviceclasses", false, "DeviceClass")]),
            list("resource.k8s.io/v1alpha3", vec![entry("deviceclasses", false, "DeviceClass")]),
        ];
        let group = group_from_resource_lists("resource.k8s.io", &lists).unwrap();
        assert_eq!(group.name(), "resource.k8s.io");
        let versions: Vec<&str> = group.versions.iter().map(|v| v.version.as_str()).collect();
        assert_eq!(versions, ["v1beta1", "v1alpha3"]);
        assert_eq!(group.versions[1].resources[0].scope, "Cluster");
    }

    #[test]
    fn core_lists_name_only_the_version() {
        let group = group_from_resource_lists("", &[api_v1()]).unwrap();
        assert_eq!(group, core_group_list(&api_v1()).items[0]);
    }

    #[test]
    fn lists_of_another_group_or_twice_the_same_version_are_refused() {
        let apps = [list("apps/v1", vec![])];
        for (group, lists) in [
            ("", &apps[..]),
            ("batch", &apps[..]),
            ("app", &apps[..]),
            ("apps", &[list("apps/", vec![])][..]),
            ("apps", &[list("apps/v1/x", vec![])][..]),
            ("", &[list("", vec![])][..]),
        ] {
            let error = group_from_resource_lists(group, lists).unwrap_err();
            assert!(matches!(error, DiscoveryError::WrongShape(_)), "{group:?}: {error:?}");
            assert!(error.to_string().contains("not a version of group"), "{error}");
        }
        let twice = [list("apps/v1", vec![]), list("apps/v1", vec![])];
        let error = group_from_resource_lists("apps", &twice).unwrap_err();
        assert!(error.to_string().contains("listed twice"), "{error}");
        assert!(group_from_resource_lists("apps", &apps).is_ok());
    }

    #[test]
    fn orphan_subresources_get_a_placeholder_parent() {
        let entries = vec![
            entry("things/status", true, ""),
            entry("others/scale", false, "Scale"),
            entry("others", false, "Other"),
        ];
        let group = group_from_resource_lists("g", &[list("g/v1", entries)]).unwrap();
        let resources = &group.versions[0].resources;
        let names: Vec<&str> = resources.iter().map(|r| r.resource.as_str()).collect();
        assert_eq!(names, ["others", "things"]);
        assert_eq!(resources[1].response_kind, Some(GroupVersionKind::default()));
        assert_eq!(resources[1].scope, "Namespaced");
        assert_eq!(resources[1].subresources[0].response_kind, Some(GroupVersionKind::default()));
        assert_eq!(subresource_names(&resources[0]), ["scale"]);
    }

    #[test]
    fn scope_mismatch_keeps_the_parent_scope() {
        let entries = vec![entry("things", false, "Thing"), entry("things/status", true, "Thing")];
        let group = group_from_resource_lists("g", &[list("g/v1", entries)]).unwrap();
        assert_eq!(group.versions[0].resources[0].scope, "Cluster");
        assert_eq!(subresource_names(&group.versions[0].resources[0]), ["status"]);
    }

    #[test]
    fn missing_optional_fields_and_nulls_are_tolerated() {
        let text = br#"{"kind":"APIResourceList","groupVersion":"g/v1","resources":[{"name":"things","kind":"Thing","verbs":null},{"name":"things/status","namespaced":null}]}"#;
        let parsed = ApiResourceList::from_json(text).unwrap();
        assert_eq!(parsed.resources[0].verbs, Vec::<String>::new());
        assert!(!parsed.resources[1].namespaced);
        let group = group_from_resource_lists("g", &[parsed]).unwrap();
        assert_eq!(group.versions[0].resources[0].subresources.len(), 1);
        // No kind at all is accepted too: nothing else would be served at these paths.
        assert!(ApiResourceList::from_json(br#"{"groupVersion":"v1"}"#).is_ok());
    }

    #[test]
    fn legacy_resource_list_round_trips_in_go_field_order() {
        let parsed = api_v1();
        let original: Value = serde_json::from_str(API_V1).unwrap();
        assert_eq!(serde_json::to_value(&parsed).unwrap(), original);
        let eviction = parsed.resources.iter().find(|r| r.name == "pods/eviction").unwrap();
        assert_eq!(
            serde_json::to_string(eviction).unwrap(),
            r#"{"name":"pods/eviction","singularName":"","namespaced":true,"group":"policy","version":"v1","kind":"Eviction","verbs":["create"]}"#
        );
    }

    #[test]
    fn api_versions_and_api_group_fixtures_parse() {
        let versions = ApiVersions::from_json(API.as_bytes()).unwrap();
        assert_eq!(versions.versions, ["v1"]);
        assert_eq!(versions.server_address_by_client_cidrs.len(), 1);
        let group: ApiGroup = serde_json::from_str(API_GROUP).unwrap();
        assert_eq!(group.name, "resource.k8s.io");
        assert_eq!(group.versions_by_preference(), ["v1beta1", "v1alpha3"]);
        let list = ApiGroupList::from_json(
            format!(r#"{{"kind":"APIGroupList","apiVersion":"v1","groups":[{API_GROUP}]}}"#).as_bytes(),
        )
        .unwrap();
        assert_eq!(list.groups, [group]);
    }

    #[test]
    fn preferred_version_comes_first_even_when_listed_later() {
        let group = ApiGroup {
            name: "g".into(),
            versions: ["v1beta1", "v1", "v1alpha1"]
                .iter()
                .map(|v| GroupVersionForDiscovery { group_version: format!("g/{v}"), version: (*v).into() })
                .collect(),
            preferred_version: GroupVersionForDiscovery {
                group_version: "g/v1".into(),
                version: "v1".into(),
            },
            ..ApiGroup::default()
        };
        assert_eq!(group.versions_by_preference(), ["v1", "v1beta1", "v1alpha1"]);
        let no_preference = ApiGroup { preferred_version: GroupVersionForDiscovery::default(), ..group };
        assert_eq!(no_preference.versions_by_preference(), ["v1beta1", "v1", "v1alpha1"]);
    }

    #[test]
    fn garbage_is_refused() {
        type Check = fn(&DiscoveryError) -> bool;
        let cases: [(&[u8], Check); 7] = [
            (b"", |e| *e == DiscoveryError::Empty),
            (b"<html>503</html>", |e| matches!(e, DiscoveryError::NotJson(_))),
            (b"{nope", |e| matches!(e, DiscoveryError::NotJson(_))),
            (br#"{"kind":"APIResourceList","resources":["#, |e| matches!(e, DiscoveryError::Truncated(_))),
            (b"[1,2]", |e| matches!(e, DiscoveryError::WrongShape(_))),
            (br#"{"kind":"APIResourceList","resources":3}"#, |e| matches!(e, DiscoveryError::WrongShape(_))),
            (br#"{"kind":"Status","code":503,"resources":3}"#, |e| {
                *e == DiscoveryError::WrongKind("Status".into())
            }),
        ];
        for (bytes, expected) in cases {
            let error = ApiResourceList::from_json(bytes).unwrap_err();
            assert!(expected(&error), "{}: {error:?}", String::from_utf8_lossy(bytes));
        }
        let aggregated =
            br#"{"kind":"APIGroupDiscoveryList","apiVersion":"apidiscovery.k8s.io/v2","items":[]}"#;
        assert_eq!(
            ApiResourceList::from_json(aggregated).unwrap_err(),
            DiscoveryError::WrongKind("APIGroupDiscoveryList".into())
        );
        assert_eq!(
            ApiGroupList::from_json(API_V1.as_bytes()).unwrap_err(),
            DiscoveryError::WrongKind("APIResourceList".into())
        );
        assert_eq!(
            ApiVersions::from_json(API_GROUP.as_bytes()).unwrap_err(),
            DiscoveryError::WrongKind("APIGroup".into())
        );
    }
}
