//! `/openapi/v2` in protobuf (gnostic's `openapi.v2.Document`), reduced: the stand-ins encode
//! the captured v2 JSON's `swagger`, `info` (title, version), every path's name (its operations
//! left out), and every definition with its description, type, properties (name and
//! description) and `x-kubernetes-group-version-kind`. Enough for a client to find every kind
//! and for skewgate's wire-level merge to be tested on real names; not a full encoding (field
//! numbers from gnostic-models' `openapiv2/OpenAPIv2.proto`).

use serde_json::Value;
use skewgate_core::protowire::Writer;

const GVK: &str = "x-kubernetes-group-version-kind";

pub fn reduced(v2: &Value) -> Vec<u8> {
    let mut doc = Writer::default();
    put_str(&mut doc, 1, v2["swagger"].as_str());
    doc.message(2, |info| {
        put_str(info, 1, v2["info"]["title"].as_str());
        put_str(info, 2, v2["info"]["version"].as_str());
    });
    doc.message(8, |paths| {
        for name in v2["paths"].as_object().into_iter().flat_map(|p| p.keys()) {
            named(paths, 2, name, |_| {});
        }
    });
    doc.message(9, |definitions| {
        for (name, s) in v2["definitions"].as_object().into_iter().flatten() {
            named(definitions, 1, name, |w| schema(s, true, w));
        }
    });
    doc.into_bytes()
}

fn schema(s: &Value, nested: bool, out: &mut Writer) {
    put_str(out, 4, s["description"].as_str());
    if let Some(kind) = s["type"].as_str() {
        out.message(22, |type_item| put_str(type_item, 1, Some(kind)));
    }
    if nested && let Some(properties) = s["properties"].as_object() {
        out.message(25, |props| {
            for (name, p) in properties {
                named(props, 1, name, |w| schema(p, false, w));
            }
        });
    }
    if let Some(gvk) = s.get(GVK) {
        named(out, 31, GVK, |any| put_str(any, 2, Some(&gvk.to_string())));
    }
}

/// A `Named*` entry: its name, and its value as `value` writes it.
fn named(out: &mut Writer, number: u32, name: &str, value: impl FnOnce(&mut Writer)) {
    out.message(number, |entry| {
        put_str(entry, 1, Some(name));
        entry.message(2, value);
    });
}

fn put_str(out: &mut Writer, number: u32, value: Option<&str>) {
    if let Some(v) = value.filter(|v| !v.is_empty()) {
        out.string(number, v);
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
