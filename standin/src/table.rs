//! Server-side printing (`Accept: application/json;as=Table;v=v1;g=meta.k8s.io`), which `kubectl
//! get` asks for: a few columns per resource, as kube-apiserver's printers show them.

use serde_json::{Value, json};

use super::catalog::Resource;
use super::clock;

/// Whether the client asked for a `meta.k8s.io` Table before plain JSON.
pub fn wanted(accept: Option<&str>) -> bool {
    let Some(accept) = accept else { return false };
    for range in accept.split(',') {
        let params: Vec<&str> = range.split(';').map(str::trim).collect();
        let has = |p: &str| params.iter().any(|x| x.eq_ignore_ascii_case(p));
        if has("as=Table") && has("g=meta.k8s.io") && (has("v=v1") || has("v=v1beta1")) {
            return true;
        }
        if params.first().is_some_and(|m| *m == "application/json" || *m == "*/*") && params.len() == 1 {
            return false;
        }
    }
    false
}

/// What each row carries (`?includeObject=`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Include {
    None,
    Metadata,
    Object,
}

impl Include {
    pub fn parse(value: Option<&str>) -> Include {
        match value {
            Some("None") => Include::None,
            Some("Object") => Include::Object,
            _ => Include::Metadata,
        }
    }
}

fn column(name: &str, kind: &str, format: &str, description: &str) -> Value {
    json!({"name": name, "type": kind, "format": format, "description": description, "priority": 0})
}

fn columns(resource: &Resource) -> Vec<Value> {
    let name = column("Name", "string", "name", "Name must be unique within a namespace.");
    let age = column(
        "Age",
        "string",
        "",
        "CreationTimestamp is a timestamp representing the server time when this object was created.",
    );
    let data = column("Data", "string", "", "Number of entries in the data.");
    match (resource.group.as_str(), resource.name.as_str()) {
        ("", "configmaps") => vec![name, data, age],
        ("", "secrets") => vec![name, column("Type", "string", "", "The type of the secret"), data, age],
        ("", "namespaces") => vec![name, column("Status", "string", "", "The status of the namespace"), age],
        _ => vec![name, age],
    }
}

fn cells(resource: &Resource, object: &Value, now: i64) -> Vec<Value> {
    let name = object["metadata"]["name"].clone();
    let age = object["metadata"]["creationTimestamp"]
        .as_str()
        .and_then(clock::parse_rfc3339)
        .map_or_else(|| "<unknown>".to_string(), |t| clock::human_duration(now - t));
    let count = |field: &str| object[field].as_object().map_or(0, serde_json::Map::len);
    match (resource.group.as_str(), resource.name.as_str()) {
        ("", "configmaps") => vec![name, json!(count("data") + count("binaryData")), json!(age)],
        ("", "secrets") => vec![name, object["type"].clone(), json!(count("data")), json!(age)],
        ("", "namespaces") => vec![name, object["status"]["phase"].clone(), json!(age)],
        _ => vec![name, json!(age)],
    }
}

/// A Table of `objects` (already shown at the requested version); `with_columns` false leaves
/// the column definitions out, as watch events after the first do.
pub fn table(
    resource: &Resource,
    objects: &[Value],
    resource_version: &str,
    include: Include,
    with_columns: bool,
) -> Value {
    let now = clock::now_unix();
    let rows: Vec<Value> = objects
        .iter()
        .map(|object| {
            let mut row = json!({"cells": cells(resource, object, now)});
            let embedded = match include {
                Include::None => None,
                Include::Object => Some(object.clone()),
                Include::Metadata => Some(json!({
                    "kind": "PartialObjectMetadata",
                    "apiVersion": "meta.k8s.io/v1",
                    "metadata": object["metadata"],
                })),
            };
            if let (Some(embedded), Some(map)) = (embedded, row.as_object_mut()) {
                map.insert("object".into(), embedded);
            }
            row
        })
        .collect();
    let mut metadata = serde_json::Map::new();
    if !resource_version.is_empty() {
        metadata.insert("resourceVersion".into(), json!(resource_version));
    }
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": metadata,
        "columnDefinitions": if with_columns { columns(resource) } else { Vec::new() },
        "rows": rows,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::Catalog;
    use crate::profile::Profile;

    #[test]
    fn kubectl_get_asks_for_a_table() {
        let kubectl = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json";
        assert!(wanted(Some(kubectl)));
        assert!(!wanted(Some("application/json")));
        assert!(!wanted(Some("application/json, application/json;as=Table;v=v1;g=meta.k8s.io")));
        assert!(!wanted(None));
    }

    #[test]
    fn configmap_rows() {
        let catalog = Catalog::new(&Profile::parse("1.33").unwrap());
        let cm = catalog.get("", "v1", "configmaps").unwrap();
        let object = json!({"metadata": {"name": "x", "creationTimestamp": clock::now_rfc3339()}, "data": {"a": "1", "b": "2"}});
        let t = table(cm, &[object], "7", Include::Metadata, true);
        assert_eq!(t["columnDefinitions"].as_array().unwrap().len(), 3);
        assert_eq!(t["rows"][0]["cells"][0], "x");
        assert_eq!(t["rows"][0]["cells"][1], 2);
        assert_eq!(t["rows"][0]["object"]["kind"], "PartialObjectMetadata");
        assert_eq!(t["metadata"]["resourceVersion"], "7");
    }
}
