//! Discovery endpoints: aggregated `/api` and `/apis` (v2, v2beta1) with ETag and 304, and the
//! legacy documents (`APIVersions`, `APIGroupList`, `APIGroup`, `APIResourceList`) derived from
//! the same profile. All built once per stand-in.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use anyhow::Result;
use bytes::Bytes;
use hyper::HeaderMap;
use hyper::header::{CACHE_CONTROL, ETAG, HeaderValue, IF_NONE_MATCH, VARY};
use serde_json::{Value, json};
use skewgate_core::accept::{DiscoveryAccept, Encoding, negotiate as negotiate_path};
use skewgate_core::discovery::protobuf::{MEDIA_TYPE_PROTOBUF, MEDIA_TYPE_V2_PROTOBUF, ToProtobuf};
use skewgate_core::discovery::{
    API_VERSION_V2BETA1, ApiGroup, ApiGroupDiscoveryList, ApiGroupList, ApiResource, ApiResourceDiscovery,
    ApiResourceList, GroupVersionForDiscovery, KIND_API_GROUP_LIST, KIND_API_RESOURCE_LIST, etag,
};
use skewgate_core::table::{LegacyPath, legacy_protobuf};

use super::captured::{self, Capture};
use super::profile::Profile;
use super::reply::{self, Reply};
use super::status::{Errors, Status};

const CORE_V1: &str = include_str!("../../testdata/discovery/legacy_core-v1/api__v1.json");
const MEDIA_TYPE_JSON: &str = "application/json";
const MEDIA_V2: &str = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";
const MEDIA_V2BETA1: &str = "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList";

/// The representation an Accept header selects for `/api` and `/apis`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Form {
    V2(Encoding),
    V2Beta1,
    Legacy(Encoding),
}

/// kube-apiserver's negotiation (skewgate's mirror of it, checked against a real server's
/// answers); a stand-in has no peers, so `nopeer` changes nothing. A server that still has
/// v2beta1 (1.32 and older) negotiates alike unless a range asks for v2beta1; then it is
/// approximated: JSON only, ranges by quality.
pub fn negotiate(path: LegacyPath<'_>, accept: Option<&str>, v2beta1: bool) -> Option<Form> {
    if v2beta1 && accept.is_some_and(|a| a.contains("v=v2beta1")) {
        return negotiate_with_v2beta1(path, accept);
    }
    match negotiate_path(path, accept) {
        DiscoveryAccept::MergedV2(encoding) | DiscoveryAccept::NoPeerV2(encoding) => Some(Form::V2(encoding)),
        DiscoveryAccept::Legacy(encoding) => Some(Form::Legacy(encoding)),
        DiscoveryAccept::Local => None,
    }
}

fn negotiate_with_v2beta1(path: LegacyPath<'_>, accept: Option<&str>) -> Option<Form> {
    let Some(accept) = accept.filter(|a| !a.trim().is_empty()) else {
        return Some(Form::Legacy(Encoding::Json));
    };
    if matches!(
        negotiate_path(path, Some(accept)),
        DiscoveryAccept::MergedV2(Encoding::Json) | DiscoveryAccept::NoPeerV2(Encoding::Json)
    ) {
        return Some(Form::V2(Encoding::Json));
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
            (true, "", "", "") => Form::Legacy(Encoding::Json),
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

/// One aggregated document in the encodings the server speaks.
struct Aggregated {
    v2: Bytes,
    v2_protobuf: Bytes,
    /// None where the server no longer speaks v2beta1.
    v2beta1: Option<Bytes>,
    etag: String,
}

impl Aggregated {
    fn new(list: &ApiGroupDiscoveryList, v2beta1: bool) -> Aggregated {
        let mut beta = list.clone();
        beta.api_version = API_VERSION_V2BETA1.to_string();
        Aggregated {
            v2: serde_json::to_vec(list).unwrap_or_default().into(),
            v2_protobuf: list.to_protobuf().into(),
            v2beta1: v2beta1.then(|| serde_json::to_vec(&beta).unwrap_or_default().into()),
            etag: format!("\"{}\"", etag(list)),
        }
    }

    /// The captured body, with the ETag upstream computes for the same list.
    fn captured(body: &Bytes, list: &ApiGroupDiscoveryList) -> Aggregated {
        Aggregated {
            v2: body.clone(),
            v2_protobuf: list.to_protobuf().into(),
            v2beta1: None,
            etag: format!("\"{}\"", etag(list)),
        }
    }
}

/// Every discovery document of one stand-in, ready to send.
pub struct Discovery {
    api: Aggregated,
    apis: Aggregated,
    /// The legacy documents by path: `/api`, `/api/v1`, `/apis`, `/apis/<g>`, `/apis/<g>/<v>`.
    legacy: HashMap<String, Bytes>,
}

impl Discovery {
    pub fn new(profile: &Profile, server_address: &str) -> Result<Discovery> {
        match profile.capture {
            Some(capture) => Discovery::captured(profile, capture, server_address),
            None => Ok(Discovery::derived(profile, server_address)),
        }
    }

    /// The captured documents as they are, but for `/api`'s `serverAddressByClientCIDRs`,
    /// where a real apiserver names its own address.
    fn captured(profile: &Profile, capture: Capture, server_address: &str) -> Result<Discovery> {
        let documents = captured::documents(capture)?;
        let mut legacy = HashMap::new();
        for path in documents.files().keys() {
            let Some(name) = path.strip_prefix("discovery/").and_then(|p| p.strip_suffix(".json")) else {
                continue;
            };
            if name.contains("aggregated") {
                continue;
            }
            let url = format!("/{}", name.replace("__", "/"));
            if let Some(body) = documents.legacy_discovery(&url) {
                legacy.insert(url, body.clone());
            }
        }
        if let Some(api) = legacy.get_mut("/api") {
            let mut versions: Value = serde_json::from_slice(api)?;
            for entry in versions["serverAddressByClientCIDRs"].as_array_mut().into_iter().flatten() {
                entry["serverAddress"] = Value::String(server_address.to_string());
            }
            *api = to_bytes(&versions);
        }
        Ok(Discovery {
            api: Aggregated::captured(documents.file("discovery/api.aggregated_v2.json")?, &profile.api),
            apis: Aggregated::captured(documents.file("discovery/apis.aggregated_v2.json")?, &profile.apis),
            legacy,
        })
    }

    /// Every document built from the profile's aggregated discovery.
    fn derived(profile: &Profile, server_address: &str) -> Discovery {
        let mut legacy = HashMap::new();
        let mut core = ApiResourceList::from_json(CORE_V1.as_bytes()).unwrap_or_default();
        core.kind = KIND_API_RESOURCE_LIST.into();
        legacy.insert("/api/v1".to_string(), to_bytes(&core));
        let mut groups = Vec::new();
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
                legacy.insert(format!("/apis/{}", list.group_version), to_bytes(&list));
            }
            let entry = ApiGroup {
                name: group.name().to_string(),
                versions,
                preferred_version: preferred,
                ..ApiGroup::default()
            };
            let document = ApiGroup { kind: "APIGroup".into(), api_version: "v1".into(), ..entry.clone() };
            legacy.insert(format!("/apis/{}", group.name()), to_bytes(&document));
            groups.push(entry);
        }
        let legacy_apis = ApiGroupList { kind: KIND_API_GROUP_LIST.into(), api_version: "v1".into(), groups };
        let legacy_api = json!({
            "kind": "APIVersions",
            "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}],
        });
        legacy.insert("/api".to_string(), to_bytes(&legacy_api));
        legacy.insert("/apis".to_string(), to_bytes(&legacy_apis));
        let v2beta1 = profile.serves_v2beta1();
        Discovery {
            api: Aggregated::new(&profile.api, v2beta1),
            apis: Aggregated::new(&profile.apis, v2beta1),
            legacy,
        }
    }

    /// Answers a GET of a discovery path, or None if `path` is not one.
    pub fn respond(&self, path: &str, headers: &HeaderMap) -> Option<Reply> {
        let path = path.trim_end_matches('/');
        let segments: Vec<&str> = path.split('/').skip(1).collect();
        let reply = match segments.as_slice() {
            ["api"] => self.aggregated(&self.api, "/api", headers),
            ["apis"] => self.aggregated(&self.apis, "/apis", headers),
            ["api", _] | ["apis", _] | ["apis", _, _] => {
                match LegacyPath::parse(path).map(|p| negotiate_path(p, accept_of(headers))) {
                    Some(DiscoveryAccept::Legacy(encoding)) => self.legacy(path, encoding),
                    Some(_) => reply::error(&Status::not_acceptable()),
                    None => reply::error(&Status::no_route()),
                }
            }
            _ => return None,
        };
        Some(reply)
    }

    /// A legacy document in JSON or, encoded as kube-apiserver does, protobuf; YAML is beyond a
    /// stand-in.
    fn legacy(&self, path: &str, encoding: Encoding) -> Reply {
        let Some(body) = self.legacy.get(path) else { return reply::error(&Status::no_route()) };
        match encoding {
            Encoding::Json => reply::bytes(200, MEDIA_TYPE_JSON, body.clone()),
            Encoding::Protobuf => match legacy_protobuf(path, body) {
                Some(protobuf) => reply::bytes(200, MEDIA_TYPE_PROTOBUF, protobuf),
                None => reply::error(&Status::internal(format!("{path}: no protobuf form"))),
            },
            Encoding::Yaml => reply::error(&Status::not_acceptable()),
        }
    }

    fn aggregated(&self, doc: &Aggregated, path: &str, headers: &HeaderMap) -> Reply {
        let root = if path == "/api" { LegacyPath::Versions } else { LegacyPath::GroupList };
        let (media, body) = match negotiate(root, accept_of(headers), doc.v2beta1.is_some()) {
            None | Some(Form::V2(Encoding::Yaml)) => return reply::error(&Status::not_acceptable()),
            Some(Form::Legacy(encoding)) => return self.legacy(path, encoding),
            Some(Form::V2(Encoding::Json)) => (MEDIA_V2, &doc.v2),
            Some(Form::V2(Encoding::Protobuf)) => (MEDIA_TYPE_V2_PROTOBUF, &doc.v2_protobuf),
            Some(Form::V2Beta1) => match &doc.v2beta1 {
                Some(body) => (MEDIA_V2BETA1, body),
                None => return reply::error(&Status::not_acceptable()),
            },
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

fn accept_of(headers: &HeaderMap) -> Option<&str> {
    headers.get(hyper::header::ACCEPT).and_then(|v| v.to_str().ok())
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

/// What one stand-in's discovery shows of the CRDs: replaced, `lag` after each change it sees.
#[derive(Default)]
pub(super) struct CrdView {
    /// Discovery with the CRDs this stand-in has seen; `None`: none (the profile's own).
    pub discovery: Mutex<Option<Arc<Discovery>>>,
    pub lag: Mutex<Duration>,
}

impl CrdView {
    pub fn current(&self) -> Option<Arc<Discovery>> {
        self.discovery.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    pub fn lag(&self) -> Duration {
        *self.lag.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn legacy_json(discovery: &Discovery, path: &str) -> Option<Value> {
        discovery.legacy.get(path).and_then(|b| serde_json::from_slice(b).ok())
    }

    #[test]
    fn negotiation() {
        use Encoding::*;
        const APIS: LegacyPath<'static> = LegacyPath::GroupList;
        let client_go = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json";
        for v2beta1 in [true, false] {
            assert_eq!(negotiate(APIS, Some(client_go), v2beta1), Some(Form::V2(Json)));
            assert_eq!(
                negotiate(APIS, Some(&format!("{MEDIA_V2};profile=nopeer")), v2beta1),
                Some(Form::V2(Json))
            );
            assert_eq!(negotiate(APIS, Some("application/json"), v2beta1), Some(Form::Legacy(Json)));
            assert_eq!(negotiate(APIS, Some("*/*"), v2beta1), Some(Form::Legacy(Json)));
            assert_eq!(negotiate(APIS, None, v2beta1), Some(Form::Legacy(Json)));
            assert_eq!(negotiate(APIS, Some("text/html"), v2beta1), None);
        }
        assert_eq!(
            negotiate(APIS, Some("application/vnd.kubernetes.protobuf"), false),
            Some(Form::Legacy(Protobuf))
        );
        assert_eq!(negotiate(APIS, Some(MEDIA_TYPE_V2_PROTOBUF), false), Some(Form::V2(Protobuf)));
        let beta_first = format!("{MEDIA_V2BETA1},application/json");
        assert_eq!(negotiate(APIS, Some(&beta_first), true), Some(Form::V2Beta1));
        // 1.36 no longer has the v2beta1 serializer: the next range wins, or nothing does.
        assert_eq!(negotiate(APIS, Some(&beta_first), false), Some(Form::Legacy(Json)));
        assert_eq!(negotiate(APIS, Some(MEDIA_V2BETA1), false), None);
    }

    #[test]
    fn legacy_documents_follow_the_profile() {
        let profile = Profile::parse("1.36:disable=resource.k8s.io/v1beta1").unwrap();
        let discovery = Discovery::new(&profile, "127.0.0.1:1").unwrap();
        let claims = legacy_json(&discovery, "/apis/resource.k8s.io/v1").unwrap();
        assert_eq!(claims["kind"], "APIResourceList");
        assert_eq!(claims["groupVersion"], "resource.k8s.io/v1");
        let names: Vec<&str> =
            claims["resources"].as_array().unwrap().iter().map(|r| r["name"].as_str().unwrap()).collect();
        assert!(names.contains(&"resourceclaims") && names.contains(&"resourceclaims/status"));
        assert!(legacy_json(&discovery, "/apis/resource.k8s.io/v1beta1").is_none());
        let deployments = legacy_json(&discovery, "/apis/apps/v1").unwrap();
        let scale = deployments["resources"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == "deployments/scale")
            .unwrap();
        assert_eq!((scale["group"].as_str(), scale["kind"].as_str()), (Some("autoscaling"), Some("Scale")));
        let core = legacy_json(&discovery, "/api/v1").unwrap();
        assert_eq!(core["groupVersion"], "v1");
        let group = legacy_json(&discovery, "/apis/resource.k8s.io").unwrap();
        assert_eq!(group["preferredVersion"]["version"], "v1");
        assert!(group["versions"].as_array().unwrap().iter().all(|v| v["version"] != "v1beta1"));
        assert!(discovery.apis.v2beta1.is_none());
        let older = Discovery::new(&Profile::parse("1.33").unwrap(), "127.0.0.1:1").unwrap();
        assert!(older.apis.v2beta1.is_some());
    }

    #[test]
    fn real_profiles_serve_the_captured_documents() {
        for (name, capture) in [("1.36-real", Capture::Native136), ("1.33-real", Capture::Emulated133)] {
            let discovery = Discovery::new(&Profile::parse(name).unwrap(), "10.0.0.9:6443").unwrap();
            let documents = captured::documents(capture).unwrap();
            assert_eq!(discovery.apis.v2, documents.files()["discovery/apis.aggregated_v2.json"]);
            assert_eq!(discovery.api.v2, documents.files()["discovery/api.aggregated_v2.json"]);
            let legacy_files = documents
                .files()
                .keys()
                .filter(|f| f.starts_with("discovery/") && !f.contains("aggregated"))
                .count();
            assert_eq!(discovery.legacy.len(), legacy_files, "{name}");
            for (path, body) in &discovery.legacy {
                if path != "/api" {
                    assert_eq!(Some(body), documents.legacy_discovery(path), "{name} {path}");
                }
            }
            let api = legacy_json(&discovery, "/api").unwrap();
            assert_eq!(api["serverAddressByClientCIDRs"][0]["serverAddress"], "10.0.0.9:6443");
            assert_eq!(discovery.apis.etag.len(), 130);
        }
    }
}
