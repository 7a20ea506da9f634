//! Kubernetes protobuf request bodies (`application/vnd.kubernetes.protobuf`) for the few kinds
//! kubectl sends through its typed clients (`create configmap|secret|namespace|serviceaccount|
//! role|clusterrole|rolebinding|clusterrolebinding`, `auth whoami`, `auth can-i`), decoded to
//! the JSON the rest of the stand-in works with. Responses are always JSON: kubectl accepts it.
//!
//! The envelope is the magic `k8s\0` followed by a `runtime.Unknown` {typeMeta, raw}; field
//! numbers below are those of the upstream `generated.proto` files.

use base64::Engine;
use serde_json::{Map, Value, json};
use skewgate_core::envelope::MAGIC;
use skewgate_core::protowire::{self, Value as Wire};

use super::status::{Errors, Status};
use Ty::{Bool, Int, MapBytes, MapStr, Msg, RepMsg, RepStr, Str, Time};

pub const MEDIA_TYPE: &str = "application/vnd.kubernetes.protobuf";

#[derive(Clone, Copy)]
enum Ty {
    Str,
    Bytes,
    Bool,
    Int,
    Time,
    Msg(&'static [Field]),
    MapStr,
    MapBytes,
    RepStr,
    RepMsg(&'static [Field]),
}

struct Field {
    number: u32,
    name: &'static str,
    ty: Ty,
}

/// A message's fields, each `number name: type`, as upstream's `generated.proto` declares them.
macro_rules! fields {
    ($($number:literal $name:ident: $ty:expr),* $(,)?) => {
        &[$(Field { number: $number, name: stringify!($name), ty: $ty }),*]
    };
}

const OWNER_REFERENCE: &[Field] = fields![
    1 kind: Str, 3 name: Str, 4 uid: Str, 5 apiVersion: Str, 6 controller: Bool, 7 blockOwnerDeletion: Bool,
];
const OBJECT_META: &[Field] = fields![
    1 name: Str, 2 generateName: Str, 3 namespace: Str, 5 uid: Str, 6 resourceVersion: Str,
    7 generation: Int, 8 creationTimestamp: Time, 11 labels: MapStr, 12 annotations: MapStr,
    13 ownerReferences: RepMsg(OWNER_REFERENCE), 14 finalizers: RepStr,
];
const CONFIG_MAP: &[Field] =
    fields![1 metadata: Msg(OBJECT_META), 2 data: MapStr, 3 binaryData: MapBytes, 4 immutable: Bool];
const SECRET: &[Field] = fields![
    1 metadata: Msg(OBJECT_META), 2 data: MapBytes, 3 type: Str, 4 stringData: MapStr, 5 immutable: Bool,
];
const NAMESPACE: &[Field] = fields![1 metadata: Msg(OBJECT_META), 2 spec: Msg(fields![1 finalizers: RepStr])];
const SERVICE_ACCOUNT: &[Field] = fields![
    1 metadata: Msg(OBJECT_META), 3 imagePullSecrets: RepMsg(fields![1 name: Str]),
    4 automountServiceAccountToken: Bool,
];
const METADATA_ONLY: &[Field] = fields![1 metadata: Msg(OBJECT_META)];
const RESOURCE_ATTRIBUTES: &[Field] = fields![
    1 namespace: Str, 2 verb: Str, 3 group: Str, 4 version: Str, 5 resource: Str, 6 subresource: Str,
    7 name: Str,
];
const ACCESS_REVIEW: &[Field] = fields![
    1 metadata: Msg(OBJECT_META),
    2 spec: Msg(fields![
        1 resourceAttributes: Msg(RESOURCE_ATTRIBUTES),
        2 nonResourceAttributes: Msg(fields![1 path: Str, 2 verb: Str]),
    ]),
];
const RULES_REVIEW: &[Field] = fields![1 metadata: Msg(OBJECT_META), 2 spec: Msg(fields![1 namespace: Str])];
const POLICY_RULE: &[Field] = fields![
    1 verbs: RepStr, 2 apiGroups: RepStr, 3 resources: RepStr, 4 resourceNames: RepStr,
    5 nonResourceURLs: RepStr,
];
const ROLE: &[Field] = fields![1 metadata: Msg(OBJECT_META), 2 rules: RepMsg(POLICY_RULE)];
const ROLE_BINDING: &[Field] = fields![
    1 metadata: Msg(OBJECT_META),
    2 subjects: RepMsg(fields![1 kind: Str, 2 apiGroup: Str, 3 name: Str, 4 namespace: Str]),
    3 roleRef: Msg(fields![1 apiGroup: Str, 2 kind: Str, 3 name: Str]),
];
const DELETE_OPTIONS: &[Field] = fields![
    1 gracePeriodSeconds: Int, 2 preconditions: Msg(fields![1 uid: Str, 2 resourceVersion: Str]),
    3 orphanDependents: Bool, 4 propagationPolicy: Str, 5 dryRun: RepStr,
];
/// The envelope, `runtime.Unknown`, but for its `raw` field ([`raw_bytes`]).
const UNKNOWN: &[Field] =
    fields![1 typeMeta: Msg(fields![1 apiVersion: Str, 2 kind: Str]), 3 contentEncoding: Str];

fn schema_of(kind: &str) -> Option<&'static [Field]> {
    Some(match kind {
        "ConfigMap" => CONFIG_MAP,
        "Secret" => SECRET,
        "Namespace" => NAMESPACE,
        "ServiceAccount" => SERVICE_ACCOUNT,
        "SelfSubjectReview" => METADATA_ONLY,
        "SelfSubjectAccessReview" | "LocalSubjectAccessReview" => ACCESS_REVIEW,
        "SelfSubjectRulesReview" => RULES_REVIEW,
        "Role" | "ClusterRole" => ROLE,
        "RoleBinding" | "ClusterRoleBinding" => ROLE_BINDING,
        "DeleteOptions" => DELETE_OPTIONS,
        _ => return None,
    })
}

pub fn is_protobuf(content_type: &str) -> bool {
    content_type.split(';').next().unwrap_or_default().trim().eq_ignore_ascii_case(MEDIA_TYPE)
}

/// The object in a protobuf body, as JSON with its `apiVersion` and `kind`.
pub fn decode(body: &[u8]) -> Result<Value, Status> {
    let unsupported =
        |why: String| Status::unsupported_media_type(&format!("{MEDIA_TYPE} ({why})"), &["application/json"]);
    let envelope = body
        .strip_prefix(MAGIC)
        .ok_or_else(|| Status::bad_request("protobuf body without the k8s envelope"))?;
    let unknown =
        message(envelope, UNKNOWN).ok_or_else(|| Status::bad_request("malformed protobuf envelope"))?;
    if unknown.get("contentEncoding").and_then(Value::as_str).is_some_and(|e| !e.is_empty()) {
        return Err(unsupported("content encoding".into()));
    }
    let kind = unknown["typeMeta"]["kind"].as_str().unwrap_or_default().to_string();
    let api_version = unknown["typeMeta"]["apiVersion"].as_str().unwrap_or_default().to_string();
    let schema =
        schema_of(&kind).ok_or_else(|| unsupported(format!("the stand-in decodes no protobuf {kind}")))?;
    let raw = raw_bytes(envelope).unwrap_or_default();
    let mut object =
        message(&raw, schema).ok_or_else(|| Status::bad_request(format!("malformed protobuf {kind}")))?;
    if let Some(map) = object.as_object_mut() {
        map.insert("apiVersion".into(), json!(api_version));
        map.insert("kind".into(), json!(kind));
    }
    Ok(object)
}

/// Field 2 (`raw`) of the envelope, undecoded.
fn raw_bytes(envelope: &[u8]) -> Option<Vec<u8>> {
    for field in protowire::fields(envelope) {
        let field = field.ok()?;
        if let (2, Wire::Bytes(bytes)) = (field.number, field.value) {
            return Some(bytes.to_vec());
        }
    }
    None
}

fn message(bytes: &[u8], schema: &[Field]) -> Option<Value> {
    let mut out = Map::new();
    for read in protowire::fields(bytes) {
        let read = read.ok()?;
        let Some(field) = schema.iter().find(|f| f.number == read.number) else { continue };
        let wire = read.value;
        let name = field.name.to_string();
        match (field.ty, wire) {
            // Go's generated code writes every string, empty or not; JSON leaves empty ones out.
            (Ty::Str, Wire::Bytes([])) => {}
            (Ty::Str, Wire::Bytes(b)) => {
                out.insert(name, json!(String::from_utf8_lossy(b)));
            }
            (Ty::Bytes, Wire::Bytes(b)) => {
                out.insert(name, json!(base64::engine::general_purpose::STANDARD.encode(b)));
            }
            (Ty::Bool, Wire::Varint(v)) => {
                out.insert(name, json!(v != 0));
            }
            (Ty::Int, Wire::Varint(0)) => {}
            (Ty::Int, Wire::Varint(v)) => {
                out.insert(name, json!(v as i64));
            }
            (Ty::Time, Wire::Bytes(b)) => {
                let seconds = message(b, fields![1 seconds: Int])?["seconds"].as_i64().unwrap_or(0);
                out.insert(name, json!(super::clock::rfc3339(seconds)));
            }
            (Ty::Msg(inner), Wire::Bytes(b)) => {
                out.insert(name, message(b, inner)?);
            }
            (Ty::RepMsg(inner), Wire::Bytes(b)) => {
                push(&mut out, name, message(b, inner)?);
            }
            (Ty::RepStr, Wire::Bytes(b)) => push(&mut out, name, json!(String::from_utf8_lossy(b))),
            (Ty::MapStr | Ty::MapBytes, Wire::Bytes(b)) => {
                let value_ty = if matches!(field.ty, Ty::MapStr) { Ty::Str } else { Ty::Bytes };
                let entry = message(b, fields![1 k: Str, 2 v: value_ty])?;
                let key = entry["k"].as_str().unwrap_or_default().to_string();
                let value = entry.get("v").cloned().unwrap_or_else(|| json!(""));
                if let Some(map) = out.entry(name).or_insert_with(|| json!({})).as_object_mut() {
                    map.insert(key, value);
                }
            }
            _ => return None,
        }
    }
    Some(Value::Object(out))
}

fn push(out: &mut Map<String, Value>, name: String, value: Value) {
    if let Some(list) = out.entry(name).or_insert_with(|| json!([])).as_array_mut() {
        list.push(value);
    }
}

#[cfg(test)]
mod tests {
    use skewgate_core::protowire::Writer;

    use super::*;

    fn map_entry(number: u32, k: &str, v: &[u8], out: &mut Writer) {
        out.message(number, |entry| {
            entry.bytes(1, k.as_bytes());
            entry.bytes(2, v);
        });
    }

    /// `k8s\0`, then a `runtime.Unknown` of `v1` `kind`, with `raw`.
    fn envelope(kind: &str, raw: Option<&[u8]>) -> Vec<u8> {
        let mut body = Writer::default();
        body.raw(MAGIC);
        body.message(1, |type_meta| {
            type_meta.string(1, "v1");
            type_meta.string(2, kind);
        });
        if let Some(raw) = raw {
            body.bytes(2, raw);
        }
        body.into_bytes()
    }

    #[test]
    fn decodes_a_configmap_like_kubectl_sends_it() {
        let mut cm = Writer::default();
        cm.message(1, |meta| {
            meta.string(1, "x");
            map_entry(11, "app", b"web", meta);
        });
        map_entry(2, "a", b"1", &mut cm);
        map_entry(3, "bin", b"\x00\x01\x02\xff", &mut cm);
        cm.bool(4, true);
        let object = decode(&envelope("ConfigMap", Some(&cm.into_bytes()))).unwrap();
        assert_eq!(
            object,
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x", "labels": {"app": "web"}}, "data": {"a": "1"}, "binaryData": {"bin": "AAEC/w=="}, "immutable": true})
        );
    }

    #[test]
    fn refuses_what_it_cannot_read() {
        assert_eq!(decode(b"nope").unwrap_err().code, 400);
        assert_eq!(decode(&envelope("Deployment", None)).unwrap_err().code, 415);
        let mut truncated = MAGIC.to_vec();
        truncated.extend_from_slice(&[0x0a, 0x10, 0x01]);
        assert_eq!(decode(&truncated).unwrap_err().code, 400);
    }
}
