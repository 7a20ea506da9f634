//! Which gated fields ([`crate::features::GATED`]) a write's body sets: read in every form a
//! Kubernetes client sends one — an object in JSON or protobuf, a JSON merge or strategic merge
//! patch, a JSON patch, an apply configuration (YAML or JSON). What cannot be read counts as
//! setting every field: such a write goes to the apiservers that keep them all, which treat a
//! body without them as any other apiserver does.

use serde_json::Value;

use crate::features::{GatedField, GatedResource, Step, bit};
use crate::{envelope, protowire};

/// The gates (a mask of [`crate::features::bit`]s, within `gates`) of the fields of `resource`
/// that `body` sets, sent as `content_type` with `content_encoding`.
pub fn gates_used(
    resource: &GatedResource,
    gates: u32,
    content_type: Option<&str>,
    content_encoding: Option<&str>,
    body: &[u8],
) -> u32 {
    let fields = || resource.fields.iter().filter(move |f| bit(f.gate) & gates != 0);
    if content_encoding.is_some_and(|e| !e.trim().eq_ignore_ascii_case("identity")) {
        return gates;
    }
    let media = content_type.unwrap_or("").split(';').next().unwrap_or("").trim().to_ascii_lowercase();
    let sets: Box<dyn Fn(&GatedField) -> bool> = match media.as_str() {
        "application/vnd.kubernetes.protobuf" => match protobuf_object(body) {
            Some(object) => Box::new(move |f: &GatedField| protobuf_sets(object, f.path)),
            None => return gates,
        },
        "application/json-patch+json" => match serde_json::from_slice::<Vec<Value>>(body) {
            Ok(ops) => Box::new(move |f: &GatedField| ops.iter().any(|op| json_patch_sets(op, f.path))),
            Err(_) => return gates,
        },
        _ => match serde_json::from_slice::<Value>(body) {
            Ok(object) => Box::new(move |f: &GatedField| json_sets(&object, f.path)),
            // YAML (an apply configuration, `application/yaml`) or something else: a body that
            // does not name the field cannot set it; one that does is not read further.
            Err(_) => Box::new(|f: &GatedField| names(body, f.path)),
        },
    };
    fields().filter(|f| sets(f)).fold(0, |m, f| m | bit(f.gate))
}

/// The object a protobuf body carries, or `None` if it is not one skewgate can read.
fn protobuf_object(body: &[u8]) -> Option<&[u8]> {
    envelope::open(body).filter(|e| e.content_encoding.is_empty() && !e.raw.is_empty()).map(|e| e.raw)
}

/// Whether the message sets the field at `path`: present on the wire, as Go's protobuf writer
/// puts a non-nil pointer (an empty string included) and leaves out a nil one. A malformed
/// message counts as setting it.
fn protobuf_sets(message: &[u8], path: &[Step]) -> bool {
    let Some((step, rest)) = path.split_first() else { return true };
    let mut found = false;
    for field in protowire::fields(message) {
        let Ok(field) = field else { return true };
        // The last occurrence of an embedded message merges with earlier ones: any counts.
        if field.number == step.proto && (rest.is_empty() || protobuf_sets(field.payload(), rest)) {
            found = true;
        }
    }
    found
}

/// Whether the JSON object sets the field at `path` (present and not null; in a merge patch,
/// null removes it).
fn json_sets(value: &Value, path: &[Step]) -> bool {
    let mut at = value;
    for step in path {
        match at.get(step.json) {
            Some(next) => at = next,
            None => return false,
        }
    }
    !at.is_null()
}

/// Whether one JSON patch operation may set the field at `path`: an `add` or `replace` at the
/// field, inside it, or of a parent whose value sets it; a `copy` or `move` anywhere on its way
/// (the value comes from the object, unseen here). `remove` and `test` set nothing.
fn json_patch_sets(op: &Value, path: &[Step]) -> bool {
    let (Some(kind), Some(pointer)) =
        (op.get("op").and_then(Value::as_str), op.get("path").and_then(Value::as_str))
    else {
        // kube-apiserver refuses it: nothing is written.
        return false;
    };
    let Some(segments) = pointer_segments(pointer) else { return false };
    let depth = segments.len().min(path.len());
    if segments.iter().take(depth).zip(path).any(|(s, step)| *s != step.json) {
        return false;
    }
    match kind {
        "add" | "replace" if segments.len() >= path.len() => true,
        "add" | "replace" => op.get("value").is_some_and(|v| json_sets(v, &path[segments.len()..])),
        "copy" | "move" => true,
        _ => false,
    }
}

/// A JSON pointer's reference tokens, unescaped (`~1` is `/`, `~0` is `~`); `None` if it is not
/// a pointer.
fn pointer_segments(pointer: &str) -> Option<Vec<String>> {
    if pointer.is_empty() {
        return Some(Vec::new());
    }
    let rest = pointer.strip_prefix('/')?;
    Some(rest.split('/').map(|s| s.replace("~1", "/").replace("~0", "~")).collect())
}

/// Whether the body names the field's last step anywhere.
fn names(body: &[u8], path: &[Step]) -> bool {
    let Some(last) = path.last() else { return true };
    body.windows(last.json.len()).any(|w| w == last.json.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::features::{self, VOLUME_ATTRIBUTES_CLASS};
    use crate::protowire::Writer;

    fn pvc() -> &'static GatedResource {
        features::gated("", "persistentvolumeclaims", "").unwrap()
    }

    fn used(content_type: &str, body: &[u8]) -> bool {
        gates_used(pvc(), bit(VOLUME_ATTRIBUTES_CLASS), Some(content_type), None, body) != 0
    }

    /// A PersistentVolumeClaim in kube-apiserver's protobuf encoding, its spec's fields given.
    fn protobuf_pvc(spec: impl FnOnce(&mut Writer)) -> Vec<u8> {
        envelope::seal("v1", "PersistentVolumeClaim", 64, |object| {
            object.message(1, |m| m.string(1, "claim"));
            object.message(2, spec);
        })
    }

    #[test]
    fn objects_in_json_set_the_field_when_present_and_not_null() {
        let json = "application/json";
        assert!(used(json, br#"{"spec":{"volumeAttributesClassName":"gold"}}"#));
        assert!(used(json, br#"{"spec":{"volumeAttributesClassName":""}}"#));
        assert!(used(json, br#"{"spec":{"\u0076olumeAttributesClassName":"gold"}}"#));
        assert!(!used(json, br#"{"spec":{"volumeAttributesClassName":null}}"#));
        assert!(!used(json, br#"{"spec":{"storageClassName":"standard"}}"#));
        assert!(!used(json, br#"{"metadata":{"annotations":{"volumeAttributesClassName":"x"}}}"#));
        assert!(!used(json, br#"{"volumeAttributesClassName":"gold"}"#));
        assert!(used("application/merge-patch+json", br#"{"spec":{"volumeAttributesClassName":"gold"}}"#));
        assert!(!used("application/strategic-merge-patch+json", br#"{"metadata":{"labels":{"a":"b"}}}"#));
        assert!(used("application/json; charset=utf-8", br#"{"spec":{"volumeAttributesClassName":"gold"}}"#));
    }

    #[test]
    fn json_patches_set_it_at_the_field_inside_it_or_through_a_parent() {
        let patch = |ops: &str| used("application/json-patch+json", ops.as_bytes());
        assert!(patch(r#"[{"op":"add","path":"/spec/volumeAttributesClassName","value":"gold"}]"#));
        assert!(patch(r#"[{"op":"replace","path":"/spec/volumeAttributesClassName","value":"gold"}]"#));
        assert!(patch(r#"[{"op":"replace","path":"/spec","value":{"volumeAttributesClassName":"gold"}}]"#));
        assert!(patch(r#"[{"op":"add","path":"","value":{"spec":{"volumeAttributesClassName":"g"}}}]"#));
        assert!(patch(r#"[{"op":"copy","from":"/metadata/name","path":"/spec/volumeAttributesClassName"}]"#));
        assert!(!patch(r#"[{"op":"replace","path":"/spec","value":{"volumeName":"pv"}}]"#));
        assert!(!patch(r#"[{"op":"remove","path":"/spec/volumeAttributesClassName"}]"#));
        assert!(!patch(r#"[{"op":"test","path":"/spec/volumeAttributesClassName","value":"gold"}]"#));
        assert!(!patch(r#"[{"op":"add","path":"/metadata/labels/a","value":"b"}]"#));
        assert!(!patch(r#"[{"op":"add","path":"/spec~1volumeAttributesClassName","value":"b"}]"#));
        assert!(!patch("[]"));
    }

    #[test]
    fn protobuf_objects_set_it_when_the_field_is_on_the_wire() {
        let protobuf = "application/vnd.kubernetes.protobuf";
        assert!(used(protobuf, &protobuf_pvc(|s| s.string(9, "gold"))));
        assert!(used(protobuf, &protobuf_pvc(|s| s.string(9, ""))));
        assert!(!used(protobuf, &protobuf_pvc(|s| s.string(5, "standard"))));
        // The same field number elsewhere (the claim's name in metadata) is not the field.
        assert!(!used(protobuf, &protobuf_pvc(|_| {})));
    }

    #[test]
    fn what_cannot_be_read_counts_as_setting_it() {
        assert!(used("application/vnd.kubernetes.protobuf", b"not protobuf"));
        assert!(used("application/vnd.kubernetes.protobuf", &protobuf_pvc(|s| s.string(9, "g"))[..12]));
        assert!(used("application/json-patch+json", b"{not json"));
        let gz = gates_used(
            pvc(),
            bit(VOLUME_ATTRIBUTES_CLASS),
            Some("application/json"),
            Some("gzip"),
            b"\x1f\x8b",
        );
        assert_ne!(gz, 0);
    }

    #[test]
    fn yaml_sets_it_only_if_it_names_it() {
        let yaml = "application/apply-patch+yaml";
        assert!(used(
            yaml,
            b"apiVersion: v1\nkind: PersistentVolumeClaim\nspec:\n  volumeAttributesClassName: gold\n"
        ));
        assert!(!used(
            yaml,
            b"apiVersion: v1\nkind: PersistentVolumeClaim\nspec:\n  storageClassName: standard\n"
        ));
        assert!(used(yaml, br#"{"spec":{"volumeAttributesClassName":"gold"}}"#));
    }

    #[test]
    fn only_the_asked_gates_count() {
        let body = br#"{"spec":{"volumeAttributesClassName":"gold"}}"#;
        assert_eq!(gates_used(pvc(), 0, Some("application/json"), None, body), 0);
        assert_eq!(gates_used(pvc(), 0, Some("application/json"), Some("gzip"), body), 0);
    }

    /// An object that sets `path` (to `leaf`), as JSON and in kube-apiserver's protobuf.
    fn object_setting(path: &[Step]) -> (Vec<u8>, Vec<u8>) {
        let json = path
            .iter()
            .rev()
            .fold(serde_json::json!("x"), |inner, step| serde_json::json!({ step.json: inner }));
        let message = path.iter().rev().fold(Vec::new(), |inner, step| {
            let mut w = Writer::default();
            w.string(1, "other");
            if inner.is_empty() {
                w.string(step.proto, "x");
            } else {
                w.bytes(step.proto, &inner);
            }
            w.into_bytes()
        });
        (serde_json::to_vec(&json).unwrap(), envelope::seal("v1", "Object", 64, |w| w.raw(&message)))
    }

    /// Every field of the catalog is found where it is, in JSON, in protobuf and through a JSON
    /// patch of its parent, and nowhere else: no other field of the same resource is taken for it.
    #[test]
    fn every_gated_field_is_found_in_every_encoding() {
        for resource in features::GATED {
            let all = resource.gates();
            for field in resource.fields {
                let (json, protobuf) = object_setting(field.path);
                let gate = bit(field.gate);
                let read = |ct: &str, body: &[u8]| gates_used(resource, all, Some(ct), None, body);
                assert_eq!(
                    read("application/json", &json) & gate,
                    gate,
                    "{} {:?}",
                    resource.resource,
                    field.path
                );
                assert_eq!(
                    read("application/vnd.kubernetes.protobuf", &protobuf) & gate,
                    gate,
                    "{:?}",
                    field.path
                );
                let parent: Vec<&str> = field.path[..field.path.len() - 1].iter().map(|s| s.json).collect();
                let last = field.path[field.path.len() - 1].json;
                let op = serde_json::json!([{"op": "add", "path": format!("/{}", parent.join("/")), "value": {last: 1}}]);
                let op = op.to_string().replace("\"//", "\"/");
                assert_eq!(read("application/json-patch+json", op.as_bytes()) & gate, gate, "{op}");
                for other in resource.fields.iter().filter(|o| o.gate != field.gate) {
                    assert_eq!(
                        read("application/json", &json) & bit(other.gate),
                        0,
                        "{:?} for {:?}",
                        field.path,
                        other.path
                    );
                    assert_eq!(read("application/vnd.kubernetes.protobuf", &protobuf) & bit(other.gate), 0);
                }
            }
        }
    }
}
