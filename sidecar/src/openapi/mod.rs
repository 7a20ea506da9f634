//! OpenAPI at the edge (docs/openapi.md): the sidecar fetches every apiserver's
//! `/openapi/v3` index, the documents it lists and `/openapi/v2`, composes one document per
//! path ([`merge`]) and serves them with kube-openapi's caching semantics on a Unix socket in
//! Envoy's directory ([`serve`]). The filter sends each OpenAPI request to an apiserver first, so
//! that the apiserver authenticates and authorizes it, and only on its success fetches the
//! composed answer from here.
//!
//! Why not the routing table: the real documents are ~8 MB (v3, all group/versions) and ~2–4 MB
//! (v2) per apiserver; in ECDS every table change would re-parse them in every worker, and
//! Envoy's ECDS parse peaks at about ten times the file.

pub mod fetch;
pub mod serve;

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::time::SystemTime;

use bytes::Bytes;
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha512};

use skewgate_openapi::merge::{self, Flavor, Outcome};
use skewgate_openapi::v2proto;

/// The composer's metrics, with the sidecar's others.
pub use crate::metrics::OpenapiMetrics as Metrics;

/// The Envoy cluster the filter fetches composed documents from.
pub const CLUSTER: &str = "skewgate-openapi";
/// Its socket, in Envoy's directory (only Envoy and the sidecar can reach it).
pub const SOCKET: &str = "openapi.sock";

/// What the composer holds at most, all apiservers' fetched documents and the composed ones
/// together: the real documents of one apiserver are ~12 MB (v3 + v2 JSON).
pub const MEMORY_BUDGET_BYTES: usize = 128 * 1024 * 1024;

/// Adds the composer's cluster (the Unix socket) to `cds.json`'s resources.
pub fn add_cluster(cds: &mut Value, socket: &std::path::Path) {
    let cluster = json!({
        "@type": "type.googleapis.com/envoy.config.cluster.v3.Cluster",
        "name": CLUSTER,
        "type": "STATIC",
        "connect_timeout": "1s",
        "load_assignment": {
            "cluster_name": CLUSTER,
            "endpoints": [{"lb_endpoints": [{"endpoint": {"address": {"pipe": {"path": socket.display().to_string()}}}}]}]
        }
    });
    if let Some(resources) = cds.get_mut("resources").and_then(Value::as_array_mut) {
        resources.push(cluster);
    }
}

/// One document and its ETag: `%X` of its SHA-512, as kube-openapi computes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Doc {
    pub body: Bytes,
    pub etag: String,
}

impl Doc {
    pub fn new(body: Bytes) -> Doc {
        let etag = Sha512::digest(&body).iter().fold(String::with_capacity(128), |mut hex, byte| {
            let _ = write!(hex, "{byte:02X}");
            hex
        });
        Doc { body, etag }
    }
}

/// One apiserver's OpenAPI as last fetched.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Fetched {
    /// The API level it serves (`/version`'s emulated major.minor, else major.minor).
    pub level: (u32, u32),
    /// `/openapi/v3` index key (`apis/<g>/<v>`, `api/v1`, `version`, ...) → document, whose
    /// ETag is the hash in the index.
    pub v3: BTreeMap<String, Doc>,
    pub v2: Option<Doc>,
    /// `/openapi/v2` in protobuf; None when the apiserver does not serve it.
    pub v2_proto: Option<Doc>,
    /// The `ETag`s the apiserver sent with v2 (JSON, protobuf), asked again with `If-None-Match`.
    pub v2_etags: [Option<String>; 2],
}

impl Fetched {
    pub fn bytes(&self) -> usize {
        let len = |d: &Option<Doc>| d.as_ref().map_or(0, |d| d.body.len());
        self.v3.values().map(|d| d.body.len()).sum::<usize>() + len(&self.v2) + len(&self.v2_proto)
    }
}

/// The API level from a `/version` body; (0, 0) when unreadable (then last in priority).
pub fn api_level(version: &[u8]) -> (u32, u32) {
    let Ok(v) = serde_json::from_slice::<Value>(version) else { return (0, 0) };
    let number = |name: &str| v[name].as_str().and_then(|s| s.trim_end_matches('+').parse::<u32>().ok());
    match (number("emulationMajor"), number("emulationMinor")) {
        (Some(major), Some(minor)) => (major, minor),
        _ => (number("major").unwrap_or(0), number("minor").unwrap_or(0)),
    }
}

/// One composed document and where it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Composite {
    pub doc: Doc,
    /// The apiservers whose document for this path went in, in priority order.
    pub inputs: Vec<String>,
    /// `None`: merged; `Some(id)`: that apiserver's document unchanged.
    pub verbatim: Option<String>,
}

/// What the edge serves.
#[derive(Debug, Clone)]
pub struct Composed {
    pub index: Doc,
    pub v3: BTreeMap<String, Composite>,
    pub v2: Option<Composite>,
    /// Only when every apiserver with a v2 document serves it in protobuf too: a protobuf
    /// document merged from fewer would lack kinds.
    pub v2_proto: Option<Composite>,
    /// `Last-Modified`.
    pub built: SystemTime,
}

impl Composed {
    /// Bytes held by the composed documents (a verbatim one shares its input's buffer, counted
    /// anyway: an upper bound).
    pub fn bytes(&self) -> usize {
        self.index.body.len()
            + self.v3.values().map(|c| c.doc.body.len()).sum::<usize>()
            + self.v2.as_ref().map_or(0, |c| c.doc.body.len())
            + self.v2_proto.as_ref().map_or(0, |c| c.doc.body.len())
    }
}

/// Where the composer writes [`Composed::summary`], in Envoy's directory.
pub const SUMMARY: &str = "openapi.json";

impl Composed {
    /// Per path, its ETag and where it came from: what `skewgate explain --openapi` shows.
    pub fn summary(&self) -> Value {
        let entry = |c: &Composite| {
            json!({
                "etag": c.doc.etag,
                "bytes": c.doc.body.len(),
                "inputs": c.inputs,
                "from": c.verbatim.as_deref().map_or("merged".to_string(), |id| format!("{id} (unchanged)")),
            })
        };
        let v3: Map<String, Value> =
            self.v3.iter().map(|(k, c)| (format!("/openapi/v3/{k}"), entry(c))).collect();
        json!({
            "/openapi/v3": {"etag": self.index.etag, "bytes": self.index.body.len(), "from": "composed index"},
            "/openapi/v2": self.v2.as_ref().map(entry),
            "/openapi/v2 (protobuf)": self.v2_proto.as_ref().map(entry),
            "documents": v3,
        })
    }

    /// The summary entry for a request path (query ignored).
    pub fn summary_entry<'s>(summary: &'s Value, path: &str) -> Option<&'s Value> {
        let path = path.split_once('?').map_or(path, |(p, _)| p);
        summary.get(path).or_else(|| summary["documents"].get(path)).filter(|v| !v.is_null())
    }
}

/// Servers in priority order: highest API level first, then as configured (server-ID order).
pub fn priority<'a>(servers: &[(&'a str, &'a Fetched)]) -> Vec<(&'a str, &'a Fetched)> {
    let mut ordered = servers.to_vec();
    ordered.sort_by_key(|s| std::cmp::Reverse(s.1.level));
    ordered
}

/// Composes per path, reusing earlier results whose inputs (by ETag) did not change.
#[derive(Debug, Default)]
pub struct Composer {
    memo: HashMap<String, (Vec<String>, Composite)>,
}

impl Composer {
    /// `servers` as configured; their priority is computed here.
    pub fn compose(&mut self, servers: &[(&str, &Fetched)]) -> Composed {
        let ordered = priority(servers);
        let mut keys: Vec<&String> = ordered.iter().flat_map(|(_, f)| f.v3.keys()).collect();
        keys.sort();
        keys.dedup();
        let mut v3 = BTreeMap::new();
        let mut memo = HashMap::new();
        for key in keys {
            let inputs: Vec<(&str, &Doc)> =
                ordered.iter().filter_map(|(id, f)| Some((*id, f.v3.get(key)?))).collect();
            if let Some(c) = self.composite(&format!("v3 {key}"), Flavor::V3, &inputs, &mut memo) {
                v3.insert(key.clone(), c);
            }
        }
        let v2_inputs: Vec<(&str, &Doc)> =
            ordered.iter().filter_map(|(id, f)| Some((*id, f.v2.as_ref()?))).collect();
        let v2 = self.composite("v2", Flavor::V2, &v2_inputs, &mut memo);
        let proto_inputs: Vec<(&str, &Doc)> =
            ordered.iter().filter_map(|(id, f)| Some((*id, f.v2_proto.as_ref()?))).collect();
        let v2_proto = match proto_inputs.len() == v2_inputs.len() {
            true => self.proto_composite(&proto_inputs, &mut memo),
            false => None,
        };
        self.memo = memo;
        let paths: Map<String, Value> = v3
            .iter()
            .map(|(key, c)| {
                (key.clone(), json!({ "serverRelativeURL": server_relative_url(key, &c.doc.etag) }))
            })
            .collect();
        let index = Doc::new(serde_json::to_vec(&json!({ "paths": paths })).unwrap_or_default().into());
        Composed { index, v3, v2, v2_proto, built: SystemTime::now() }
    }

    fn proto_composite(
        &self,
        inputs: &[(&str, &Doc)],
        memo: &mut HashMap<String, (Vec<String>, Composite)>,
    ) -> Option<Composite> {
        const KEY: &str = "v2 protobuf";
        let (first_id, first) = inputs.first()?;
        let tags: Vec<String> = inputs.iter().map(|(id, d)| format!("{id}={}", d.etag)).collect();
        if let Some(entry) = self.memo.get(KEY).filter(|(seen, _)| *seen == tags) {
            memo.insert(KEY.to_string(), entry.clone());
            return Some(entry.1.clone());
        }
        let ids: Vec<String> = inputs.iter().map(|(id, _)| id.to_string()).collect();
        let composite = if inputs.iter().all(|(_, d)| d.etag == first.etag) {
            Composite { doc: (*first).clone(), inputs: ids, verbatim: Some(first_id.to_string()) }
        } else {
            let bodies: Vec<&[u8]> = inputs.iter().map(|(_, d)| &d.body[..]).collect();
            match v2proto::merge(&bodies) {
                Ok(merged) => Composite { doc: Doc::new(merged.into()), inputs: ids, verbatim: None },
                Err(error) => {
                    tracing::warn!(%error, "cannot merge /openapi/v2 protobuf; it is not served");
                    return None;
                }
            }
        };
        memo.insert(KEY.to_string(), (tags, composite.clone()));
        Some(composite)
    }

    fn composite(
        &self,
        memo_key: &str,
        flavor: Flavor,
        inputs: &[(&str, &Doc)],
        memo: &mut HashMap<String, (Vec<String>, Composite)>,
    ) -> Option<Composite> {
        let (first_id, first) = inputs.first()?;
        let tags: Vec<String> = inputs.iter().map(|(id, d)| format!("{id}={}", d.etag)).collect();
        if let Some((seen, c)) = self.memo.get(memo_key).filter(|(seen, _)| *seen == tags) {
            memo.insert(memo_key.to_string(), (seen.clone(), c.clone()));
            return Some(c.clone());
        }
        let ids: Vec<String> = inputs.iter().map(|(id, _)| id.to_string()).collect();
        let composite = if inputs.iter().all(|(_, d)| d.etag == first.etag) {
            Composite { doc: (*first).clone(), inputs: ids, verbatim: Some(first_id.to_string()) }
        } else {
            // A document that does not parse counts as absent: the others still compose.
            let parsed: Vec<(&str, &Doc, Value)> = inputs
                .iter()
                .filter_map(|(id, d)| Some((*id, *d, serde_json::from_slice::<Value>(&d.body).ok()?)))
                .collect();
            let values: Vec<&Value> = parsed.iter().map(|(_, _, v)| v).collect();
            let used: Vec<String> = parsed.iter().map(|(id, _, _)| id.to_string()).collect();
            match merge::merge(flavor, &values) {
                Outcome::Input(i) => {
                    let (id, doc, _) = parsed.get(i)?;
                    Composite { doc: (*doc).clone(), inputs: used, verbatim: Some(id.to_string()) }
                }
                Outcome::Merged(v) => Composite {
                    doc: Doc::new(serde_json::to_vec(&v).ok()?.into()),
                    inputs: used,
                    verbatim: None,
                },
            }
        };
        memo.insert(memo_key.to_string(), (tags, composite.clone()));
        Some(composite)
    }
}

/// `/openapi/v3/<key>?hash=<etag>`, as kube-openapi's `constructServerRelativeURL`.
pub fn server_relative_url(key: &str, etag: &str) -> String {
    format!("/openapi/v3/{}?hash={etag}", key.trim_matches('/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fetched(level: (u32, u32), docs: &[(&str, &str)]) -> Fetched {
        let v3 =
            docs.iter().map(|(k, body)| (k.to_string(), Doc::new(Bytes::from(body.to_string())))).collect();
        Fetched { level, v3, ..Fetched::default() }
    }

    #[test]
    fn api_levels() {
        assert_eq!(
            api_level(br#"{"major":"1","minor":"36+","emulationMajor":"1","emulationMinor":"33"}"#),
            (1, 33)
        );
        assert_eq!(api_level(br#"{"major":"1","minor":"36"}"#), (1, 36));
        assert_eq!(api_level(b"nope"), (0, 0));
    }

    #[test]
    fn newest_first_then_configured_order_and_memo() {
        let a = fetched((1, 33), &[("apis/g/v1", r#"{"paths":{"/a":1}}"#), ("version", "{}")]);
        let b = fetched((1, 36), &[("apis/g/v1", r#"{"paths":{"/a":2,"/b":2}}"#), ("apis/g/v2", "{}")]);
        let mut composer = Composer::default();
        let c = composer.compose(&[("a", &a), ("b", &b)]);
        let gv = &c.v3["apis/g/v1"];
        assert_eq!((gv.inputs.clone(), gv.verbatim.as_deref()), (vec!["b".into(), "a".into()], Some("b")));
        assert_eq!(c.v3.keys().collect::<Vec<_>>(), ["apis/g/v1", "apis/g/v2", "version"]);
        let index: Value = serde_json::from_slice(&c.index.body).unwrap();
        assert_eq!(
            index["paths"]["apis/g/v1"]["serverRelativeURL"],
            json!(server_relative_url("apis/g/v1", &b.v3["apis/g/v1"].etag))
        );
        // Unchanged inputs: the same composition, byte for byte.
        let again = composer.compose(&[("a", &a), ("b", &b)]);
        assert_eq!(again.index, c.index);
    }
}
