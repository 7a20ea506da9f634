//! OpenAPI v3, minimal but shaped like kube-apiserver's, for the group/versions a stand-in serves:
//! kubectl reads `/openapi/v3` to find the per-group-version documents, checks a resource's PATCH
//! operation for the `fieldValidation` parameter (server-side field validation), and `kubectl
//! explain` finds the kind through an operation's `x-kubernetes-group-version-kind` and then the
//! schema carrying the same GVK.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};

use bytes::Bytes;
use serde_json::{Map, Value, json};

use super::catalog::{Catalog, Resource};

const META: &str = "io.k8s.apimachinery.pkg.apis.meta.v1";

/// The index and every group/version document, built once.
pub struct OpenApi {
    index: Bytes,
    /// `api/v1` or `apis/<g>/<v>` → (document, hash).
    documents: HashMap<String, (Bytes, String)>,
}

impl OpenApi {
    pub fn new(catalog: &Catalog, git_version: &str) -> OpenApi {
        let mut documents = HashMap::new();
        let mut paths = Map::new();
        for (group, version) in catalog.group_versions() {
            let key =
                if group.is_empty() { format!("api/{version}") } else { format!("apis/{group}/{version}") };
            let document = group_version_document(catalog, group, version, git_version);
            let bytes: Bytes = serde_json::to_vec(&document).unwrap_or_default().into();
            let hash = hash_hex(&bytes);
            paths.insert(key.clone(), json!({"serverRelativeURL": format!("/openapi/v3/{key}?hash={hash}")}));
            documents.insert(key, (bytes, hash));
        }
        let index = serde_json::to_vec(&json!({ "paths": paths })).unwrap_or_default().into();
        OpenApi { index, documents }
    }

    pub fn index(&self) -> Bytes {
        self.index.clone()
    }

    /// The document at `/openapi/v3/<key>` and its hash.
    pub fn document(&self, key: &str) -> Option<(Bytes, &str)> {
        self.documents.get(key).map(|(doc, hash)| (doc.clone(), hash.as_str()))
    }
}

fn hash_hex(bytes: &[u8]) -> String {
    // Two differently seeded std hashes: stable within a build, which is all a cache key needs.
    let mut out = String::new();
    for seed in [0x5eed_u64, 0xc0ffee] {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        seed.hash(&mut h);
        bytes.hash(&mut h);
        out.push_str(&format!("{:016X}", h.finish()));
    }
    out
}

/// `io.k8s.api.<package>.<version>.<Kind>` as upstream names built-in types.
fn schema_name(group: &str, version: &str, kind: &str) -> String {
    let package = if group.is_empty() { "core" } else { group.split('.').next().unwrap_or(group) };
    format!("io.k8s.api.{package}.{version}.{kind}")
}

fn reference(name: &str) -> Value {
    json!({ "$ref": format!("#/components/schemas/{name}") })
}

fn gvk(group: &str, version: &str, kind: &str) -> Value {
    json!({"group": group, "version": version, "kind": kind})
}

fn query(name: &str, kind: &str, description: &str) -> Value {
    json!({"name": name, "in": "query", "description": description, "schema": {"type": kind, "uniqueItems": true}})
}

fn write_parameters(patch: bool) -> Vec<Value> {
    let mut params = vec![
        query("dryRun", "string", "When present, indicates that modifications should not be persisted."),
        query(
            "fieldManager",
            "string",
            "fieldManager is a name associated with the actor or entity that is making these changes.",
        ),
        query(
            "fieldValidation",
            "string",
            "fieldValidation instructs the server on how to handle objects in the request (POST/PUT/PATCH) containing unknown or duplicate fields. Valid values are: Ignore, Warn, Strict.",
        ),
    ];
    if patch {
        params.push(query("force", "boolean", "Force is going to \"force\" Apply requests."));
    }
    params
}

fn list_parameters() -> Vec<Value> {
    [
        ("allowWatchBookmarks", "boolean"),
        ("continue", "string"),
        ("fieldSelector", "string"),
        ("labelSelector", "string"),
        ("limit", "integer"),
        ("resourceVersion", "string"),
        ("resourceVersionMatch", "string"),
        ("sendInitialEvents", "boolean"),
        ("timeoutSeconds", "integer"),
        ("watch", "boolean"),
    ]
    .iter()
    .map(|(name, kind)| query(name, kind, ""))
    .collect()
}

fn ok(schema: &str, codes: &[&str]) -> Value {
    let mut responses = Map::new();
    for code in codes {
        responses.insert(
            (*code).to_string(),
            json!({"description": if *code == "201" { "Created" } else { "OK" }, "content": {"application/json": {"schema": reference(schema)}}}),
        );
    }
    responses.insert("401".into(), json!({"description": "Unauthorized"}));
    Value::Object(responses)
}

struct Operation<'a> {
    action: &'a str,
    id: String,
    gvk: Value,
    parameters: Vec<Value>,
    body: Option<(Vec<&'a str>, String)>,
    responses: Value,
}

impl Operation<'_> {
    fn to_json(&self, tag: &str) -> Value {
        let mut op = json!({
            "tags": [tag],
            "description": format!("{} {}", self.action, self.gvk["kind"].as_str().unwrap_or_default()),
            "operationId": self.id,
            "parameters": self.parameters,
            "responses": self.responses,
            "x-kubernetes-action": self.action,
            "x-kubernetes-group-version-kind": self.gvk,
        });
        if let (Some((types, schema)), Some(map)) = (&self.body, op.as_object_mut()) {
            let content: Map<String, Value> =
                types.iter().map(|t| ((*t).to_string(), json!({"schema": reference(schema)}))).collect();
            map.insert("requestBody".into(), json!({"content": content, "required": true}));
        }
        op
    }
}

fn group_version_document(catalog: &Catalog, group: &str, version: &str, git_version: &str) -> Value {
    let prefix =
        if group.is_empty() { format!("/api/{version}") } else { format!("/apis/{group}/{version}") };
    let tag = format!(
        "{}_{version}",
        if group.is_empty() { "core" } else { group.split('.').next().unwrap_or(group) }
    );
    let mut paths = Map::new();
    let mut schemas = meta_schemas();
    for r in catalog.resources_of(group, version) {
        let kind_schema = schema_name(group, version, &r.kind);
        if !r.kind.is_empty() {
            schemas.insert(kind_schema.clone(), kind_schema_json(r));
            schemas.insert(format!("{kind_schema}List"), list_schema_json(r, &kind_schema));
        }
        let base = if r.namespaced {
            format!("{prefix}/namespaces/{{namespace}}/{}", r.name)
        } else {
            format!("{prefix}/{}", r.name)
        };
        let id_kind = format!("{}{}", r.kind, if r.namespaced { "Namespaced" } else { "" });
        let the_gvk = gvk(group, version, &r.kind);
        let operation = |action: &'static str,
                         verb: &str,
                         params: Vec<Value>,
                         body: Option<(Vec<&'static str>, String)>,
                         responses: Value| {
            Operation {
                action,
                id: format!("{verb}{id_kind}"),
                gvk: the_gvk.clone(),
                parameters: params,
                body,
                responses,
            }
            .to_json(&tag)
        };
        let patch_types = vec![
            "application/json-patch+json",
            "application/merge-patch+json",
            "application/apply-patch+yaml",
        ];
        let mut collection = Map::new();
        if r.allows("list") || r.allows("watch") {
            collection.insert(
                "get".into(),
                operation(
                    "list",
                    "list",
                    list_parameters(),
                    None,
                    ok(&format!("{kind_schema}List"), &["200"]),
                ),
            );
        }
        if r.allows("create") {
            collection.insert(
                "post".into(),
                operation(
                    "post",
                    "create",
                    write_parameters(false),
                    Some((vec!["*/*"], kind_schema.clone())),
                    ok(&kind_schema, &["200", "201"]),
                ),
            );
        }
        if r.allows("deletecollection") {
            collection.insert(
                "delete".into(),
                operation(
                    "deletecollection",
                    "deletecollection",
                    list_parameters(),
                    None,
                    ok(&format!("{META}.Status"), &["200"]),
                ),
            );
        }
        let mut item = Map::new();
        if r.allows("get") {
            item.insert("get".into(), operation("get", "read", vec![], None, ok(&kind_schema, &["200"])));
        }
        if r.allows("update") {
            item.insert(
                "put".into(),
                operation(
                    "put",
                    "replace",
                    write_parameters(false),
                    Some((vec!["*/*"], kind_schema.clone())),
                    ok(&kind_schema, &["200", "201"]),
                ),
            );
        }
        if r.allows("patch") {
            item.insert(
                "patch".into(),
                operation(
                    "patch",
                    "patch",
                    write_parameters(true),
                    Some((patch_types.clone(), format!("{META}.Patch"))),
                    ok(&kind_schema, &["200", "201"]),
                ),
            );
        }
        if r.allows("delete") {
            item.insert(
                "delete".into(),
                operation(
                    "delete",
                    "delete",
                    vec![query("dryRun", "string", "")],
                    None,
                    ok(&format!("{META}.Status"), &["200"]),
                ),
            );
        }
        let scope = path_parameters(r.namespaced, false);
        if !collection.is_empty() {
            collection.insert("parameters".into(), scope);
            paths.insert(base.clone(), Value::Object(collection));
        }
        if !item.is_empty() {
            item.insert("parameters".into(), path_parameters(r.namespaced, true));
            paths.insert(format!("{base}/{{name}}"), Value::Object(item));
        }
        if let Some(status) = r.subresource("status") {
            let mut ops = Map::new();
            let allows = |v: &str| status.verbs.iter().any(|s| s == v);
            if allows("get") {
                ops.insert("get".into(), operation("get", "read", vec![], None, ok(&kind_schema, &["200"])));
            }
            if allows("update") {
                ops.insert(
                    "put".into(),
                    operation(
                        "put",
                        "replace",
                        write_parameters(false),
                        Some((vec!["*/*"], kind_schema.clone())),
                        ok(&kind_schema, &["200", "201"]),
                    ),
                );
            }
            if allows("patch") {
                ops.insert(
                    "patch".into(),
                    operation(
                        "patch",
                        "patch",
                        write_parameters(true),
                        Some((patch_types, format!("{META}.Patch"))),
                        ok(&kind_schema, &["200", "201"]),
                    ),
                );
            }
            ops.insert("parameters".into(), path_parameters(r.namespaced, true));
            paths.insert(format!("{base}/{{name}}/status"), Value::Object(ops));
        }
    }
    json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": git_version},
        "paths": paths,
        "components": {"schemas": schemas},
    })
}

fn path_parameters(namespaced: bool, named: bool) -> Value {
    let path = |name: &str, description: &str| json!({"name": name, "in": "path", "description": description, "required": true, "schema": {"type": "string", "uniqueItems": true}});
    let mut params = Vec::new();
    if named {
        params.push(path("name", "name of the object"));
    }
    if namespaced {
        params.push(path("namespace", "object name and auth scope, such as for teams and projects"));
    }
    params.push(query("pretty", "string", "If 'true', then the output is pretty printed."));
    Value::Array(params)
}

fn described(kind: &str, description: &str) -> Value {
    json!({"type": kind, "description": description})
}

fn kind_schema_json(r: &Resource) -> Value {
    let mut properties = Map::new();
    properties.insert(
        "apiVersion".into(),
        described("string", "APIVersion defines the versioned schema of this representation of an object. Servers should convert recognized schemas to the latest internal value, and may reject unrecognized values."),
    );
    properties.insert(
        "kind".into(),
        described("string", "Kind is a string value representing the REST resource this object represents. Servers may infer this from the endpoint the client submits requests to. Cannot be updated. In CamelCase."),
    );
    properties.insert(
        "metadata".into(),
        json!({"allOf": [reference(&format!("{META}.ObjectMeta"))], "default": {}, "description": "Standard object's metadata."}),
    );
    let loose = |description: &str| json!({"type": "object", "description": description, "x-kubernetes-preserve-unknown-fields": true});
    match r.kind.as_str() {
        "ConfigMap" | "Secret" => {
            properties.insert(
                "data".into(),
                json!({"type": "object", "additionalProperties": {"type": "string", "default": ""}, "description": "Data contains the configuration data."}),
            );
            let other = if r.kind == "ConfigMap" { "binaryData" } else { "stringData" };
            properties.insert(
                other.into(),
                json!({"type": "object", "additionalProperties": {"type": "string", "default": ""}}),
            );
            properties.insert(
                "immutable".into(),
                described(
                    "boolean",
                    "Immutable, if set to true, ensures that data stored cannot be updated.",
                ),
            );
            if r.kind == "Secret" {
                properties.insert(
                    "type".into(),
                    described("string", "Used to facilitate programmatic handling of secret data."),
                );
            }
        }
        _ => {
            properties.insert(
                "spec".into(),
                loose(&format!("Spec describes the desired state of the {}.", r.kind)),
            );
            if r.has_status() || r.kind == "Namespace" {
                properties.insert(
                    "status".into(),
                    loose(&format!("Status describes the observed state of the {}.", r.kind)),
                );
            }
            if r.kind == "Event" || r.kind == "Endpoints" || r.kind == "ControllerRevision" {
                properties.insert("data".into(), loose("Data of the object."));
            }
        }
    }
    let description = match r.kind.as_str() {
        "ConfigMap" => "ConfigMap holds configuration data for pods to consume.".to_string(),
        "ResourceClaim" => "ResourceClaim describes a request for access to resources in the cluster, for use by workloads. For example, if a workload needs an accelerator device with specific properties, this is how that request is expressed. The status stanza tracks whether this claim has been satisfied and what specific resources have been allocated.".to_string(),
        kind => format!("{kind} of {}; the skewgate stand-in apiserver models its top-level fields only.", r.api_version()),
    };
    let mut schema = json!({
        "type": "object",
        "description": description,
        "properties": properties,
        "x-kubernetes-group-version-kind": [gvk(&r.group, &r.version, &r.kind)],
    });
    if !matches!(r.kind.as_str(), "ConfigMap" | "Secret")
        && let Some(map) = schema.as_object_mut()
    {
        map.insert("x-kubernetes-preserve-unknown-fields".into(), Value::Bool(true));
    }
    schema
}

fn list_schema_json(r: &Resource, item: &str) -> Value {
    json!({
        "type": "object",
        "description": format!("{}List is a list of {} objects.", r.kind, r.kind),
        "required": ["items"],
        "properties": {
            "apiVersion": {"type": "string"},
            "items": {"type": "array", "items": {"allOf": [reference(item)], "default": {}}},
            "kind": {"type": "string"},
            "metadata": {"allOf": [reference(&format!("{META}.ListMeta"))], "default": {}},
        },
        "x-kubernetes-group-version-kind": [gvk(&r.group, &r.version, &format!("{}List", r.kind))],
    })
}

fn meta_schemas() -> Map<String, Value> {
    let object_meta = json!({
        "type": "object",
        "description": "ObjectMeta is metadata that all persisted resources must have, which includes all objects users must create.",
        "properties": {
            "annotations": {"type": "object", "additionalProperties": {"type": "string", "default": ""}, "description": "Annotations is an unstructured key value map stored with a resource."},
            "creationTimestamp": {"type": "string", "format": "date-time", "description": "CreationTimestamp is a timestamp representing the server time when this object was created."},
            "deletionGracePeriodSeconds": {"type": "integer", "format": "int64"},
            "deletionTimestamp": {"type": "string", "format": "date-time"},
            "finalizers": {"type": "array", "items": {"type": "string", "default": ""}, "x-kubernetes-list-type": "set"},
            "generateName": {"type": "string", "description": "GenerateName is an optional prefix, used by the server, to generate a unique name ONLY IF the Name field has not been provided."},
            "generation": {"type": "integer", "format": "int64", "description": "A sequence number representing a specific generation of the desired state."},
            "labels": {"type": "object", "additionalProperties": {"type": "string", "default": ""}, "description": "Map of string keys and values that can be used to organize and categorize (scope and select) objects."},
            "managedFields": {"type": "array", "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}},
            "name": {"type": "string", "description": "Name must be unique within a namespace."},
            "namespace": {"type": "string", "description": "Namespace defines the space within which each name must be unique."},
            "ownerReferences": {"type": "array", "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}, "x-kubernetes-patch-merge-key": "uid", "x-kubernetes-patch-strategy": "merge"},
            "resourceVersion": {"type": "string", "description": "An opaque value that represents the internal version of this object."},
            "selfLink": {"type": "string"},
            "uid": {"type": "string", "description": "UID is the unique in time and space value for this object."},
        },
    });
    let list_meta = json!({
        "type": "object",
        "properties": {
            "continue": {"type": "string"},
            "remainingItemCount": {"type": "integer", "format": "int64"},
            "resourceVersion": {"type": "string"},
            "selfLink": {"type": "string"},
        },
    });
    let status = json!({
        "type": "object",
        "properties": {
            "apiVersion": {"type": "string"}, "code": {"type": "integer", "format": "int32"},
            "details": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
            "kind": {"type": "string"}, "message": {"type": "string"},
            "metadata": {"allOf": [reference(&format!("{META}.ListMeta"))], "default": {}},
            "reason": {"type": "string"}, "status": {"type": "string"},
        },
        "x-kubernetes-group-version-kind": [gvk("", "v1", "Status")],
    });
    let mut schemas = Map::new();
    schemas.insert(format!("{META}.ObjectMeta"), object_meta);
    schemas.insert(format!("{META}.ListMeta"), list_meta);
    schemas.insert(format!("{META}.Status"), status);
    schemas.insert(format!("{META}.Patch"), json!({"type": "object", "description": "Patch is provided to give a concrete name and type to the Kubernetes PATCH request body."}));
    schemas
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::standin::profile::Profile;

    fn doc(openapi: &OpenApi, key: &str) -> Value {
        serde_json::from_slice(&openapi.document(key).unwrap().0).unwrap()
    }

    #[test]
    fn index_lists_only_served_group_versions() {
        let catalog = Catalog::new(&Profile::parse("1.36:disable=resource.k8s.io/v1beta1").unwrap());
        let openapi = OpenApi::new(&catalog, "v1.36.0");
        let index: Value = serde_json::from_slice(&openapi.index()).unwrap();
        let url = index["paths"]["apis/resource.k8s.io/v1"]["serverRelativeURL"].as_str().unwrap();
        assert!(url.starts_with("/openapi/v3/apis/resource.k8s.io/v1?hash="));
        assert!(index["paths"]["api/v1"].is_object());
        assert!(index["paths"].get("apis/resource.k8s.io/v1beta1").is_none());
        assert!(openapi.document("apis/resource.k8s.io/v1beta1").is_none());
    }

    #[test]
    fn patch_operations_carry_field_validation_and_the_gvk() {
        let catalog = Catalog::new(&Profile::parse("1.36").unwrap());
        let openapi = OpenApi::new(&catalog, "v1.36.0");
        let core = doc(&openapi, "api/v1");
        let patch = &core["paths"]["/api/v1/namespaces/{namespace}/configmaps/{name}"]["patch"];
        assert_eq!(
            patch["x-kubernetes-group-version-kind"],
            json!({"group": "", "version": "v1", "kind": "ConfigMap"})
        );
        assert!(
            patch["parameters"]
                .as_array()
                .unwrap()
                .iter()
                .any(|p| p["name"] == "fieldValidation" && p["in"] == "query")
        );
        let schema = &core["components"]["schemas"]["io.k8s.api.core.v1.ConfigMap"];
        assert_eq!(schema["x-kubernetes-group-version-kind"][0]["kind"], "ConfigMap");
        assert!(schema["properties"]["data"]["additionalProperties"].is_object());
        let dra = doc(&openapi, "apis/resource.k8s.io/v1");
        let claims =
            &dra["paths"]["/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}/status"];
        assert!(claims["patch"].is_object());
        assert!(
            dra["components"]["schemas"]["io.k8s.api.resource.v1.ResourceClaim"]["properties"]["status"]
                .is_object()
        );
        let nodes = &core["paths"]["/api/v1/nodes"];
        assert!(nodes["get"].is_object());
    }
}
