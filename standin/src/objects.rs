//! The rules every stored object follows, whichever verb writes it: what the server owns in
//! `metadata` (uid, creationTimestamp, generation, name generation), what a client may not change,
//! name validation, and how a stored object is shown at the version a request names.

use serde_json::{Value, json};

use super::catalog::Resource;
use super::clock;
use super::profile::Profile;
use super::status::{Errors, Status};
use super::store::metadata_mut;

/// The stored object as the requested group/version shows it: objects are stored once per
/// group and resource, whatever version wrote them.
pub(super) fn shown(r: &Resource, object: &Value) -> Value {
    let mut out = object.clone();
    if let Some(map) = out.as_object_mut() {
        map.insert("apiVersion".into(), Value::String(r.api_version()));
        map.insert("kind".into(), Value::String(r.kind.clone()));
    }
    out
}

pub(super) fn check_type(object: &Value, r: &Resource) -> Result<(), Status> {
    if let Some(api_version) = object["apiVersion"].as_str().filter(|v| !v.is_empty()) {
        let group = api_version.rsplit_once('/').map_or("", |(g, _)| g);
        if group != r.group {
            return Err(Status::bad_request(format!(
                "the API version in the data ({api_version}) does not match the expected API version ({})",
                r.api_version()
            )));
        }
    }
    if let Some(kind) = object["kind"].as_str().filter(|k| !k.is_empty() && *k != r.kind) {
        return Err(Status::bad_request(format!(
            "the kind in the data ({kind}) does not match the expected kind ({})",
            r.kind
        )));
    }
    Ok(())
}

pub(super) fn text_at<'v>(object: &'v Value, field: &str) -> &'v str {
    object["metadata"][field].as_str().unwrap_or_default()
}

const DNS1123_SUBDOMAIN: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";

const DNS1123_LABEL: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";

/// Why `name` is not a valid object name for `r`, as upstream's validation says it.
fn name_problem(r: &Resource, name: &str) -> Option<String> {
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    if r.group.is_empty() && r.name == "namespaces" {
        if name.len() > 63 || !label_ok(name) {
            return Some(DNS1123_LABEL.into());
        }
        return None;
    }
    if r.group == "rbac.authorization.k8s.io" {
        let bad = name == "." || name == ".." || name.contains('/') || name.contains('%');
        return bad.then(|| format!("may not contain '/' or '%' and may not be '.' or '..': {name:?}"));
    }
    if name.len() > 253 || !name.split('.').all(label_ok) {
        return Some(DNS1123_SUBDOMAIN.into());
    }
    None
}

fn invalid_name(r: &Resource, name: &str, problem: &str) -> Status {
    Status::invalid(&r.kind, &r.group, name, "metadata.name", &format!("Invalid value: {name:?}: {problem}"))
}

/// Five characters from upstream's generateName alphabet (no vowels, no confusable digits).
fn random_suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    uuid::Uuid::new_v4()
        .as_bytes()
        .iter()
        .take(5)
        .map(|b| char::from(ALPHABET[usize::from(*b) % ALPHABET.len()]))
        .collect()
}

/// Everything but metadata and status: a change here bumps `metadata.generation`.
fn desired_state(object: &Value) -> Value {
    let mut copy = object.clone();
    if let Some(map) = copy.as_object_mut() {
        for field in ["metadata", "status", "apiVersion", "kind"] {
            map.remove(field);
        }
    }
    copy
}

fn without_resource_version(object: &Value) -> Value {
    let mut copy = object.clone();
    if let Some(meta) = copy.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.remove("resourceVersion");
    }
    copy
}

/// A new object from a create body: server-owned metadata set, name generated if asked.
pub(super) fn new_object(r: &Resource, namespace: &str, mut object: Value) -> Result<Value, Status> {
    let body_namespace = text_at(&object, "namespace").to_string();
    if r.namespaced && !body_namespace.is_empty() && body_namespace != namespace {
        return Err(Status::bad_request(
            "the namespace of the provided object does not match the namespace sent on the request",
        ));
    }
    let mut name = text_at(&object, "name").to_string();
    let generate = text_at(&object, "generateName").to_string();
    if name.is_empty() && !generate.is_empty() {
        name = format!("{generate}{}", random_suffix());
    }
    if name.is_empty() {
        return Err(Status::invalid(
            &r.kind,
            &r.group,
            "",
            "metadata.name",
            "Required value: name or generateName is required",
        ));
    }
    if let Some(problem) = name_problem(r, &name) {
        return Err(invalid_name(r, &name, &problem));
    }
    let is_namespace = r.group.is_empty() && r.name == "namespaces";
    if let Some(map) = object.as_object_mut() {
        map.insert("apiVersion".into(), Value::String(r.api_version()));
        map.insert("kind".into(), Value::String(r.kind.clone()));
        if r.has_status() || is_namespace {
            map.remove("status");
        }
    }
    let meta = metadata_mut(&mut object)
        .ok_or_else(|| Status::bad_request("the object provided is unrecognized"))?;
    for server_owned in
        ["resourceVersion", "deletionTimestamp", "deletionGracePeriodSeconds", "selfLink", "managedFields"]
    {
        meta.remove(server_owned);
    }
    meta.insert("name".into(), json!(name));
    if r.namespaced {
        meta.insert("namespace".into(), json!(namespace));
    } else {
        meta.remove("namespace");
    }
    meta.insert("uid".into(), json!(uuid::Uuid::new_v4().to_string()));
    meta.insert("creationTimestamp".into(), json!(clock::now_rfc3339()));
    meta.insert("generation".into(), json!(1));
    if r.group.is_empty()
        && r.kind == "Secret"
        && let Some(map) = object.as_object_mut()
        && map.get("type").and_then(Value::as_str).is_none_or(str::is_empty)
    {
        map.insert("type".into(), json!("Opaque"));
    }
    let meta = metadata_mut(&mut object)
        .ok_or_else(|| Status::bad_request("the object provided is unrecognized"))?;
    if is_namespace {
        let labels = meta.entry("labels").or_insert_with(|| json!({}));
        if let Some(labels) = labels.as_object_mut() {
            labels.insert("kubernetes.io/metadata.name".into(), json!(name));
        }
        if let Some(map) = object.as_object_mut() {
            let spec = map.entry("spec").or_insert_with(|| json!({}));
            if let Some(spec) = spec.as_object_mut() {
                spec.entry("finalizers").or_insert_with(|| json!(["kubernetes"]));
            }
            map.insert("status".into(), json!({"phase": "Active"}));
        }
    }
    Ok(object)
}

/// What kube-apiserver's strategies drop from a written object while a feature gate is off
/// (`DropDisabledSpecFields`): a claim's `spec.volumeAttributesClassName`, unless the stored
/// claim (`old`) has one.
pub(super) fn drop_disabled_fields(profile: &Profile, r: &Resource, old: Option<&Value>, new: &mut Value) {
    let class = |o: &Value| {
        o.get("spec").and_then(|s| s.get("volumeAttributesClassName")).is_some_and(|c| !c.is_null())
    };
    if r.group.is_empty()
        && r.name == "persistentvolumeclaims"
        && !profile.volume_attributes_class()
        && !old.is_some_and(class)
    {
        if let Some(spec) = new.get_mut("spec").and_then(Value::as_object_mut) {
            spec.remove("volumeAttributesClassName");
        }
    }
}

/// The object an update (or a patch, once applied) stores, or None if nothing changed.
/// `status_only`: the write went to the status subresource.
pub(super) fn updated_object(
    r: &Resource,
    current: &Value,
    mut incoming: Value,
    status_only: bool,
) -> Result<Option<Value>, Status> {
    let name = text_at(current, "name");
    if text_at(&incoming, "name") != name {
        return Err(Status::bad_request(format!(
            "the name of the object ({}) does not match the name on the URL ({name})",
            text_at(&incoming, "name")
        )));
    }
    let mut next = if status_only {
        let mut next = current.clone();
        if let Some(map) = next.as_object_mut() {
            match incoming.get("status") {
                Some(status) => map.insert("status".into(), status.clone()),
                None => map.remove("status"),
            };
        }
        next
    } else {
        if let Some(map) = incoming.as_object_mut() {
            map.insert("apiVersion".into(), current["apiVersion"].clone());
            map.insert("kind".into(), Value::String(r.kind.clone()));
            if r.has_status() || (r.group.is_empty() && r.name == "namespaces") {
                match current.get("status") {
                    Some(status) => map.insert("status".into(), status.clone()),
                    None => map.remove("status"),
                };
            }
        }
        let meta = metadata_mut(&mut incoming)
            .ok_or_else(|| Status::bad_request("the object provided is unrecognized"))?;
        for immutable in ["uid", "creationTimestamp", "namespace", "generation", "deletionTimestamp"] {
            match current["metadata"].get(immutable) {
                Some(value) => meta.insert(immutable.into(), value.clone()),
                None => meta.remove(immutable),
            };
        }
        meta.remove("managedFields");
        incoming
    };
    if desired_state(&next) != desired_state(current) {
        let generation = current["metadata"]["generation"].as_i64().unwrap_or(0) + 1;
        if let Some(meta) = metadata_mut(&mut next) {
            meta.insert("generation".into(), json!(generation));
        }
    }
    if without_resource_version(&next) == without_resource_version(current) {
        return Ok(None);
    }
    Ok(Some(next))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::Catalog;
    use crate::profile::Profile;

    #[test]
    fn names_are_validated_as_upstream() {
        let catalog = Catalog::new(&Profile::parse("1.36").unwrap());
        let cm = catalog.get("", "v1", "configmaps").unwrap();
        let ns = catalog.get("", "v1", "namespaces").unwrap();
        let roles = catalog.get("rbac.authorization.k8s.io", "v1", "clusterroles").unwrap();
        assert!(name_problem(cm, "a.b-c").is_none());
        assert!(name_problem(cm, "Bad_Name").is_some());
        assert!(name_problem(ns, "a.b").is_some());
        assert!(name_problem(roles, "system:aggregate-to-edit").is_none());
        assert_eq!(random_suffix().len(), 5);
    }

    #[test]
    fn generation_moves_only_with_the_desired_state() {
        let catalog = Catalog::new(&Profile::parse("1.36").unwrap());
        let cm = catalog.get("", "v1", "configmaps").unwrap();
        let current = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x", "uid": "u", "generation": 1, "resourceVersion": "5"}, "data": {"a": "1"}});
        let labelled = json!({"metadata": {"name": "x", "labels": {"l": "v"}}, "data": {"a": "1"}});
        let next = updated_object(cm, &current, labelled, false).unwrap().unwrap();
        assert_eq!(next["metadata"]["generation"], 1);
        assert_eq!(next["metadata"]["uid"], "u");
        let changed = json!({"metadata": {"name": "x"}, "data": {"a": "2"}});
        assert_eq!(
            updated_object(cm, &current, changed, false).unwrap().unwrap()["metadata"]["generation"],
            2
        );
        let same = json!({"metadata": {"name": "x", "resourceVersion": "5"}, "data": {"a": "1"}});
        assert_eq!(updated_object(cm, &current, same, false).unwrap(), None);
    }
}
