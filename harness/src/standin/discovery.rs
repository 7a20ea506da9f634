//! Discovery endpoints: aggregated `/api` and `/apis` (v2, v2beta1) with ETag and 304, and the
//! legacy documents (`APIVersions`, `APIGroupList`, `APIGroup`, `APIResourceList`) derived from
//! the same profile. All built once per stand-in.

use std::collections::HashMap;

use bytes::Bytes;
use hyper::HeaderMap;
use hyper::header::{CACHE_CONTROL, ETAG, HeaderValue, IF_NONE_MATCH, VARY};
#[cfg(test)]
use serde_json::Value;
use serde_json::json;
use skewgate_core::accept::{DiscoveryAccept, negotiate_discovery};
use skewgate_core::discovery::{
    API_VERSION_V2BETA1, ApiGroup, ApiGroupDiscoveryList, ApiGroupList, ApiResource, ApiResourceDiscovery,
    ApiResourceList, GroupVersionForDiscovery, KIND_API_GROUP_LIST, KIND_API_RESOURCE_LIST, etag,
};

use super::profile::Profile;
use super::reply::{self, Reply};
use super::status::Status;

const CORE_V1: &str = include_str!("../../../testdata/discovery/legacy_core-v1/api__v1.json");
const MEDIA_V2: &str = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";
const MEDIA_V2BETA1: &str = "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList";

/// The representation an Accept header selects for `/api` and `/apis`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Form {
    V2,
    V2Beta1,
    Legacy,
}

/// kube-apiserver negotiates against its discovery serializers: v2 (with or without the
/// `nopeer` profile; a stand-in has no peers), then v2beta1, then the legacy types.
pub fn negotiate(accept: Option<&str>) -> Option<Form> {
    let Some(accept) = accept.filter(|a| !a.trim().is_empty()) else { return Some(Form::Legacy) };
    if matches!(negotiate_discovery(Some(accept)), DiscoveryAccept::MergedV2 | DiscoveryAccept::NoPeerV2) {
        return Some(Form::V2);
    }
    let mut ranges: Vec<(u16, usize, Form)> = Vec::new();
    for (index, range) in accept.split(',').enumerate() {
        let mut params = range.split(';');
        let media = params.next().unwrap_or_default().trim().to_ascii_lowercase();
        let (mut q, mut g, mut v, mut kind) = (1000u16, "", "", "");
        for param in params {
            let Some((name, value)) = param.split_once('=') else { continue };
            let value = value.trim().trim_matches('"');
            match name.trim() {
                "q" => q = (value.parse::<f32>().unwrap_or(0.0).clamp(0.0, 1.0) * 1000.0) as u16,
                "g" => g = value,
                "v" => v = value,
                "as" => kind = value,
                _ => {}
            }
        }
        let json = matches!(media.as_str(), "application/json" | "*/*" | "application/*");
        let form = match (json, g, v, kind) {
            (true, "", "", "") => Form::Legacy,
            (true, "apidiscovery.k8s.io", "v2beta1", "APIGroupDiscoveryList") => Form::V2Beta1,
            _ => continue,
        };
        if q > 0 {
            ranges.push((q, index, form));
        }
    }
    ranges.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    ranges.first().map(|r| r.2)
}

/// One aggregated document in both its encodings.
struct Aggregated {
    v2: Bytes,
    v2beta1: Bytes,
    etag: String,
}

impl Aggregated {
    fn new(list: &ApiGroupDiscoveryList) -> Aggregated {
        let mut beta = list.clone();
        beta.api_version = API_VERSION_V2BETA1.to_string();
        Aggregated {
            v2: serde_json::to_vec(list).unwrap_or_default().into(),
            v2beta1: serde_json::to_vec(&beta).unwrap_or_default().into(),
            etag: format!("\"{}\"", etag(list)),
        }
    }
}

/// Every discovery document of one stand-in, ready to send.
pub struct Discovery {
    api: Aggregated,
    apis: Aggregated,
    legacy_api: Bytes,
    legacy_apis: Bytes,
    legacy_groups: HashMap<String, Bytes>,
    /// `v1` for core, `group/version` otherwise.
    resource_lists: HashMap<String, Bytes>,
}

impl Discovery {
    pub fn new(profile: &Profile, server_address: &str) -> Discovery {
        let mut resource_lists = HashMap::new();
        let mut core = ApiResourceList::from_json(CORE_V1.as_bytes()).unwrap_or_default();
        core.kind = KIND_API_RESOURCE_LIST.into();
        resource_lists.insert("v1".to_string(), to_bytes(&core));
        let mut groups = Vec::new();
        let mut legacy_groups = HashMap::new();
        for group in &profile.apis.items {
            let versions: Vec<GroupVersionForDiscovery> = group
                .versions
                .iter()
                .map(|v| GroupVersionForDiscovery {
                    group_version: format!("{}/{}", group.name(), v.version),
                    version: v.version.clone(),
                })
                .collect();
            let Some(preferred) = versions.first().cloned() else { continue };
            for version in &group.versions {
                let list = ApiResourceList {
                    kind: KIND_API_RESOURCE_LIST.into(),
                    api_version: "v1".into(),
                    group_version: format!("{}/{}", group.name(), version.version),
                    resources: version.resources.iter().flat_map(legacy_resources).collect(),
                };
                resource_lists.insert(list.group_version.clone(), to_bytes(&list));
            }
            let entry = ApiGroup {
                name: group.name().to_string(),
                versions,
                preferred_version: preferred,
                ..ApiGroup::default()
            };
            let document = ApiGroup { kind: "APIGroup".into(), api_version: "v1".into(), ..entry.clone() };
            legacy_groups.insert(group.name().to_string(), to_bytes(&document));
            groups.push(entry);
        }
        let legacy_apis = ApiGroupList { kind: KIND_API_GROUP_LIST.into(), api_version: "v1".into(), groups };
        let legacy_api = json!({
            "kind": "APIVersions",
            "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}],
        });
        Discovery {
            api: Aggregated::new(&profile.api),
            apis: Aggregated::new(&profile.apis),
            legacy_api: to_bytes(&legacy_api),
            legacy_apis: to_bytes(&legacy_apis),
            legacy_groups,
            resource_lists,
        }
    }

    /// Answers a GET of a discovery path, or None if `path` is not one.
    pub fn respond(&self, path: &str, headers: &HeaderMap) -> Option<Reply> {
        let path = path.trim_end_matches('/');
        let segments: Vec<&str> = path.split('/').skip(1).collect();
        let reply = match segments.as_slice() {
            ["api"] => self.aggregated(&self.api, &self.legacy_api, headers),
            ["apis"] => self.aggregated(&self.apis, &self.legacy_apis, headers),
            ["api", version] => self.legacy(self.resource_lists.get(*version).filter(|_| *version == "v1")),
            ["apis", group] => self.legacy(self.legacy_groups.get(*group)),
            ["apis", group, version] => self.legacy(self.resource_lists.get(&format!("{group}/{version}"))),
            _ => return None,
        };
        Some(reply)
    }

    fn legacy(&self, document: Option<&Bytes>) -> Reply {
        match document {
            Some(body) => reply::bytes(200, "application/json", body.clone()),
            None => reply::error(&Status::no_route()),
        }
    }

    fn aggregated(&self, doc: &Aggregated, legacy: &Bytes, headers: &HeaderMap) -> Reply {
        let accept = headers.get(hyper::header::ACCEPT).and_then(|v| v.to_str().ok());
        let (media, body) = match negotiate(accept) {
            None => return reply::error(&Status::not_acceptable()),
            Some(Form::Legacy) => return reply::bytes(200, "application/json", legacy.clone()),
            Some(Form::V2) => (MEDIA_V2, &doc.v2),
            Some(Form::V2Beta1) => (MEDIA_V2BETA1, &doc.v2beta1),
        };
        let matches = headers
            .get(IF_NONE_MATCH)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|tags| tags.split(',').any(|t| t.trim() == doc.etag));
        let mut resp = if matches { reply::empty(304) } else { reply::bytes(200, media, body.clone()) };
        let h = resp.headers_mut();
        if let Ok(tag) = HeaderValue::from_str(&doc.etag) {
            h.insert(ETAG, tag);
        }
        h.insert(VARY, HeaderValue::from_static("Accept"));
        h.insert(CACHE_CONTROL, HeaderValue::from_static("public"));
        resp
    }
}

fn to_bytes(value: &impl serde::Serialize) -> Bytes {
    serde_json::to_vec(value).unwrap_or_default().into()
}

/// The legacy entries of one aggregated resource: itself, then `resource/sub` per subresource.
fn legacy_resources(r: &ApiResourceDiscovery) -> Vec<ApiResource> {
    let namespaced = r.scope == "Namespaced";
    let kind = r.response_kind.as_ref().map(|k| k.kind.clone()).unwrap_or_default();
    let mut entries = vec![ApiResource {
        name: r.resource.clone(),
        singular_name: r.singular_resource.clone(),
        namespaced,
        kind,
        verbs: r.verbs.clone(),
        short_names: r.short_names.clone(),
        categories: r.categories.clone(),
        ..ApiResource::default()
    }];
    for sub in &r.subresources {
        let gvk = sub.response_kind.clone().unwrap_or_default();
        entries.push(ApiResource {
            name: format!("{}/{}", r.resource, sub.subresource),
            namespaced,
            group: gvk.group,
            version: gvk.version,
            kind: gvk.kind,
            verbs: sub.verbs.clone(),
            ..ApiResource::default()
        });
    }
    entries
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resource_list_json(discovery: &Discovery, group_version: &str) -> Option<Value> {
        discovery.resource_lists.get(group_version).and_then(|b| serde_json::from_slice(b).ok())
    }

    #[test]
    fn negotiation() {
        let client_go = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json";
        assert_eq!(negotiate(Some(client_go)), Some(Form::V2));
        assert_eq!(negotiate(Some(&format!("{MEDIA_V2};profile=nopeer"))), Some(Form::V2));
        assert_eq!(negotiate(Some(&format!("{MEDIA_V2BETA1},application/json"))), Some(Form::V2Beta1));
        assert_eq!(negotiate(Some("application/json")), Some(Form::Legacy));
        assert_eq!(negotiate(Some("*/*")), Some(Form::Legacy));
        assert_eq!(negotiate(None), Some(Form::Legacy));
        assert_eq!(negotiate(Some("application/vnd.kubernetes.protobuf")), None);
        assert_eq!(negotiate(Some("text/html")), None);
    }

    #[test]
    fn legacy_documents_follow_the_profile() {
        let profile = Profile::parse("1.36:disable=resource.k8s.io/v1beta1").unwrap();
        let discovery = Discovery::new(&profile, "127.0.0.1:1");
        let claims = resource_list_json(&discovery, "resource.k8s.io/v1").unwrap();
        assert_eq!(claims["kind"], "APIResourceList");
        assert_eq!(claims["groupVersion"], "resource.k8s.io/v1");
        let names: Vec<&str> =
            claims["resources"].as_array().unwrap().iter().map(|r| r["name"].as_str().unwrap()).collect();
        assert!(names.contains(&"resourceclaims") && names.contains(&"resourceclaims/status"));
        assert!(resource_list_json(&discovery, "resource.k8s.io/v1beta1").is_none());
        let deployments = resource_list_json(&discovery, "apps/v1").unwrap();
        let scale = deployments["resources"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == "deployments/scale")
            .unwrap();
        assert_eq!((scale["group"].as_str(), scale["kind"].as_str()), (Some("autoscaling"), Some("Scale")));
        let core = resource_list_json(&discovery, "v1").unwrap();
        assert_eq!(core["groupVersion"], "v1");
        let group: Value = serde_json::from_slice(&discovery.legacy_groups["resource.k8s.io"]).unwrap();
        assert_eq!(group["preferredVersion"]["version"], "v1");
        assert!(group["versions"].as_array().unwrap().iter().all(|v| v["version"] != "v1beta1"));
    }
}
