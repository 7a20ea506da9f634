//! PATCH bodies: JSON patch (RFC 6902), JSON merge patch (RFC 7386), strategic merge patch
//! (applied as a merge patch once its `$` directives are taken out) and server-side apply
//! (applied as a merge patch; JSON only, since there is no YAML parser here).

use serde_json::Value;

use super::status::{Errors, Status};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchType {
    Json,
    Merge,
    Strategic,
    Apply,
}

pub const ACCEPTED: [&str; 4] = [
    "application/json-patch+json",
    "application/merge-patch+json",
    "application/strategic-merge-patch+json",
    "application/apply-patch+yaml",
];

impl PatchType {
    pub fn from_content_type(content_type: &str) -> Option<PatchType> {
        let media = content_type.split(';').next().unwrap_or_default().trim().to_ascii_lowercase();
        match media.as_str() {
            "application/json-patch+json" => Some(PatchType::Json),
            "application/merge-patch+json" => Some(PatchType::Merge),
            "application/strategic-merge-patch+json" => Some(PatchType::Strategic),
            "application/apply-patch+yaml" => Some(PatchType::Apply),
            _ => None,
        }
    }
}

/// The patch body as JSON; `Apply` bodies that are not JSON get 415 (YAML is not parsed here).
pub fn parse(kind: PatchType, body: &[u8]) -> Result<Value, Status> {
    serde_json::from_slice(body).map_err(|e| match kind {
        PatchType::Apply => Status::unsupported_media_type(
            "application/apply-patch+yaml (YAML)",
            &["application/apply-patch+yaml with a JSON body"],
        ),
        _ => Status::bad_request(format!("error decoding patch: {e}")),
    })
}

/// Applies `patch` to `target`.
pub fn apply(kind: PatchType, target: &Value, patch: &Value) -> Result<Value, Status> {
    let mut out = target.clone();
    match kind {
        PatchType::Json => {
            let ops: json_patch::Patch = serde_json::from_value(patch.clone())
                .map_err(|e| Status::bad_request(format!("error decoding JSON patch: {e}")))?;
            json_patch::patch(&mut out, &ops).map_err(|e| {
                Status::failure(
                    422,
                    "Invalid",
                    format!("the server rejected our request due to an error in our request: {e}"),
                )
            })?;
        }
        PatchType::Merge | PatchType::Apply => {
            require_object(patch)?;
            json_patch::merge(&mut out, patch);
        }
        PatchType::Strategic => {
            require_object(patch)?;
            json_patch::merge(&mut out, &without_directives(patch));
        }
    }
    Ok(out)
}

fn require_object(patch: &Value) -> Result<(), Status> {
    if patch.is_object() { Ok(()) } else { Err(Status::bad_request("a merge patch must be a JSON object")) }
}

/// Strategic-merge directives have no merge-patch meaning: `$patch: delete` deletes the value,
/// list elements marked so are dropped, every other `$…` key is ignored.
fn without_directives(value: &Value) -> Value {
    match value {
        Value::Object(map) => {
            if map.get("$patch").and_then(Value::as_str) == Some("delete") {
                return Value::Null;
            }
            Value::Object(
                map.iter()
                    .filter(|(k, _)| !k.starts_with('$'))
                    .map(|(k, v)| (k.clone(), without_directives(v)))
                    .collect(),
            )
        }
        Value::Array(items) => Value::Array(
            items
                .iter()
                .filter(|item| item.get("$patch").and_then(Value::as_str) != Some("delete"))
                .map(without_directives)
                .collect(),
        ),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_four_kinds() {
        let target = json!({"metadata": {"name": "x"}, "data": {"a": "1", "b": "2"}});
        let merged = apply(PatchType::Merge, &target, &json!({"data": {"a": "2", "b": null}})).unwrap();
        assert_eq!(merged["data"], json!({"a": "2"}));
        let ops = json!([{"op": "replace", "path": "/data/a", "value": "3"}, {"op": "add", "path": "/data/c", "value": "4"}]);
        let patched = apply(PatchType::Json, &target, &ops).unwrap();
        assert_eq!(patched["data"], json!({"a": "3", "b": "2", "c": "4"}));
        let failed =
            apply(PatchType::Json, &target, &json!([{"op": "test", "path": "/data/a", "value": "9"}]))
                .unwrap_err();
        assert_eq!(failed.code, 422);
        let smp = json!({"$setElementOrder/data": [], "data": {"a": "5", "gone": {"$patch": "delete"}}});
        assert_eq!(apply(PatchType::Strategic, &target, &smp).unwrap()["data"], json!({"a": "5", "b": "2"}));
        assert_eq!(apply(PatchType::Apply, &target, &json!({"data": {"z": "1"}})).unwrap()["data"]["z"], "1");
        assert_eq!(apply(PatchType::Merge, &target, &json!([1])).unwrap_err().code, 400);
    }

    #[test]
    fn content_types() {
        assert_eq!(
            PatchType::from_content_type("application/merge-patch+json; charset=utf-8"),
            Some(PatchType::Merge)
        );
        assert_eq!(PatchType::from_content_type("application/json"), None);
        assert_eq!(parse(PatchType::Apply, b"data:\n  a: b\n").unwrap_err().code, 415);
        assert_eq!(parse(PatchType::Merge, b"{").unwrap_err().code, 400);
    }
}
