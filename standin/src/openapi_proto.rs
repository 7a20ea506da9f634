//! `/openapi/v2` in protobuf (gnostic's `openapi.v2.Document`), reduced: the stand-ins encode
//! the captured v2 JSON's `swagger`, `info` (title, version), every path's name (its operations
//! left out), and every definition with its description, type, properties (name and
//! description) and `x-kubernetes-group-version-kind`. Enough for a client to find every kind
//! and for skewgate's wire-level merge to be tested on real names; not a full encoding (field
//! numbers from gnostic-models' `openapiv2/OpenAPIv2.proto`).

use serde_json::Value;
use skewgate_openapi::v2proto::put_bytes;

const GVK: &str = "x-kubernetes-group-version-kind";

pub fn reduced(v2: &Value) -> Vec<u8> {
    let mut doc = Vec::new();
    put_str(&mut doc, 1, v2["swagger"].as_str());
    let mut info = Vec::new();
    put_str(&mut info, 1, v2["info"]["title"].as_str());
    put_str(&mut info, 2, v2["info"]["version"].as_str());
    put_bytes(&mut doc, 2, &info);
    let mut paths = Vec::new();
    for name in v2["paths"].as_object().into_iter().flat_map(|p| p.keys()) {
        put_bytes(&mut paths, 2, &named(name, &[]));
    }
    put_bytes(&mut doc, 8, &paths);
    let mut definitions = Vec::new();
    for (name, schema) in v2["definitions"].as_object().into_iter().flatten() {
        put_bytes(&mut definitions, 1, &named(name, &self::schema(schema, true)));
    }
    put_bytes(&mut doc, 9, &definitions);
    doc
}

fn schema(s: &Value, nested: bool) -> Vec<u8> {
    let mut out = Vec::new();
    put_str(&mut out, 4, s["description"].as_str());
    if let Some(kind) = s["type"].as_str() {
        let mut type_item = Vec::new();
        put_str(&mut type_item, 1, Some(kind));
        put_bytes(&mut out, 22, &type_item);
    }
    if nested && let Some(properties) = s["properties"].as_object() {
        let mut props = Vec::new();
        for (name, p) in properties {
            put_bytes(&mut props, 1, &named(name, &schema(p, false)));
        }
        put_bytes(&mut out, 25, &props);
    }
    if let Some(gvk) = s.get(GVK) {
        let mut any = Vec::new();
        put_str(&mut any, 2, Some(&gvk.to_string()));
        put_bytes(&mut out, 31, &named(GVK, &any));
    }
    out
}

fn named(name: &str, value: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    put_str(&mut out, 1, Some(name));
    put_bytes(&mut out, 2, value);
    out
}

fn put_str(out: &mut Vec<u8>, number: u32, value: Option<&str>) {
    if let Some(v) = value.filter(|v| !v.is_empty()) {
        put_bytes(out, number, v.as_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_definition_and_path_by_name() {
        let v2 = serde_json::json!({
            "swagger": "2.0", "info": {"title": "Kubernetes", "version": "v1.36.2"},
            "paths": {"/api/v1/pods": {"get": {}}},
            "definitions": {"io.k8s.api.core.v1.Pod": {"description": "Pod", "type": "object",
                "properties": {"spec": {"description": "spec"}},
                GVK: [{"group": "", "version": "v1", "kind": "Pod"}]}}
        });
        let names = skewgate_openapi::v2proto::names(&reduced(&v2)).unwrap();
        assert_eq!(
            names.into_iter().collect::<Vec<_>>(),
            ["definitions/io.k8s.api.core.v1.Pod", "paths//api/v1/pods"]
        );
    }
}
