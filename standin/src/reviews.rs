//! Resources that exist only to be posted to (access and token reviews, bindings, evictions):
//! answered from what the stand-in knows, never stored. `selfsubjectreviews` is what `kubectl
//! auth whoami` reads, so it shows exactly the identity the stand-in authenticated.

use serde_json::{Value, json};

use super::auth::Identity;
use super::call::{Addressed, Call, body_object};
use super::instance::Instance;
use super::reply::{self, Reply};
use super::status::Status;
use super::store::metadata_mut;

pub(super) fn create_only(instance: &Instance, call: &Call<'_>, t: &Addressed<'_>) -> Result<Reply, Status> {
    let r = t.r;
    let mut object =
        if call.body.iter().all(u8::is_ascii_whitespace) { json!({}) } else { body_object(call, r)? };
    let status = match (r.group.as_str(), r.name.as_str()) {
        ("authentication.k8s.io", "selfsubjectreviews") => {
            Some(json!({"userInfo": user_info(call.identity)}))
        }
        ("authentication.k8s.io", "tokenreviews") => {
            let token = object["spec"]["token"].as_str().unwrap_or_default();
            match instance.auth.tokens.iter().find(|t| !token.is_empty() && t.token == token) {
                Some(found) => {
                    let mut groups = found.groups.clone();
                    groups.push("system:authenticated".into());
                    Some(json!({"authenticated": true, "user": {"username": found.user, "groups": groups}}))
                }
                None => Some(json!({"authenticated": false, "error": "invalid bearer token"})),
            }
        }
        (
            "authorization.k8s.io",
            "selfsubjectaccessreviews" | "subjectaccessreviews" | "localsubjectaccessreviews",
        ) => Some(json!({"allowed": true, "reason": "the skewgate stand-in does not authorize"})),
        ("authorization.k8s.io", "selfsubjectrulesreviews") => Some(json!({
            "resourceRules": [{"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]}],
            "nonResourceRules": [{"verbs": ["*"], "nonResourceURLs": ["*"]}],
            "incomplete": false,
        })),
        _ => None,
    };
    if let Some(map) = object.as_object_mut() {
        map.insert("apiVersion".into(), Value::String(r.api_version()));
        map.insert("kind".into(), Value::String(r.kind.clone()));
        if let Some(status) = status {
            map.insert("status".into(), status);
        }
    }
    if let Some(meta) = metadata_mut(&mut object) {
        meta.entry("creationTimestamp").or_insert(Value::Null);
    }
    Ok(reply::json(201, &object))
}

/// `authentication.k8s.io` UserInfo: what `kubectl auth whoami` prints.
fn user_info(identity: &Identity) -> Value {
    let mut info = json!({"username": identity.user, "groups": identity.groups});
    if let Some(map) = info.as_object_mut() {
        if !identity.uid.is_empty() {
            map.insert("uid".into(), json!(identity.uid));
        }
        if !identity.extra.is_empty() {
            map.insert("extra".into(), json!(identity.extra));
        }
    }
    info
}
