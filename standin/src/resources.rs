//! Resource requests: get, list, watch, create, update, patch, delete and deletecollection on
//! every group/version/resource a stand-in serves, plus the `status` subresource and the
//! create-only review resources, with kube-apiserver's semantics (resourceVersion preconditions,
//! generation, uid, generateName, namespace existence, Status errors worded as upstream).

use std::time::Duration;

use hyper::header::{ACCEPT, CONTENT_TYPE};
use serde_json::{Map, Value, json};

use super::call::{Addressed, Call, body_object, decode_body};
use super::catalog::Resource;
use super::clock;
use super::instance::Instance;
use super::objects::{check_type, drop_disabled_fields, new_object, shown, text_at, updated_object};
use super::patch::{self, PatchType};
use super::reply::{self, Reply};
use super::reviews::create_only;
use super::selector::{FieldSelector, LabelSelector};
use super::status::{Details, Errors, Status};
use super::store::{Key, ListQuery, Write, metadata_mut};
use super::table::{self, Include};
use super::watch::{self, Start};

/// Namespaces upstream refuses to delete.
const UNDELETABLE_NAMESPACES: [&str; 3] = ["default", "kube-system", "kube-public"];

pub(super) fn handle(instance: &Instance, call: Call<'_>) -> Reply {
    match dispatch(instance, &call) {
        Ok(reply) => reply,
        Err(status) => reply::error(&status),
    }
}

fn dispatch(instance: &Instance, call: &Call<'_>) -> Result<Reply, Status> {
    let info = call.info;
    if info.error.is_some() {
        return Err(Status::internal(format!("unable to determine the request for {}", info.path)));
    }
    let custom;
    let r = match instance.catalog.get(info.api_group, info.api_version, info.resource) {
        Some(r) => r,
        None => {
            // Served from the store's CRDs at once, whatever this stand-in's discovery shows yet.
            custom = super::crds::resource(&instance.store, info.api_group, info.api_version, info.resource)
                .ok_or_else(Status::no_route)?;
            &custom
        }
    };
    let verb: &str = &info.verb;
    if verb == "proxy" || verb.is_empty() {
        return Err(Status::method_not_allowed());
    }
    let path_name = info.parts().nth(1).unwrap_or_default();
    let is_namespace_object = r.group.is_empty() && r.name == "namespaces";
    let namespace = if is_namespace_object { "" } else { info.namespace };
    if !r.namespaced && !namespace.is_empty() {
        return Err(Status::no_route());
    }
    if r.namespaced && namespace.is_empty() {
        if !path_name.is_empty() {
            return Err(Status::no_route());
        }
        if !matches!(verb, "list" | "watch") {
            return Err(Status::method_not_allowed());
        }
    }
    let t = Addressed { r, namespace, name: path_name, status: info.subresource == "status" };
    if !info.subresource.is_empty() {
        let sub = r.subresource(info.subresource).ok_or_else(Status::no_route)?;
        if !sub.verbs.iter().any(|v| v == verb) {
            return Err(Status::method_not_allowed());
        }
        if sub.name != "status" {
            // Scale, logs, exec, eviction, ...: not emulated.
            return Err(Status::no_route());
        }
        return match verb {
            "get" => get(instance, call, &t),
            "update" => update(instance, call, &t),
            "patch" => patch_object(instance, call, &t),
            _ => Err(Status::method_not_allowed()),
        };
    }
    if !r.allows(verb) {
        return Err(Status::method_not_allowed());
    }
    if r.is_create_only() {
        return create_only(instance, call, &t);
    }
    match verb {
        "get" => get(instance, call, &t),
        "list" => list(instance, call, &t),
        "watch" => watch_objects(instance, call, &t),
        "create" => create(instance, call, &t),
        "update" => update(instance, call, &t),
        "patch" => patch_object(instance, call, &t),
        "delete" => delete(instance, call, &t),
        "deletecollection" => delete_collection(instance, call, &t),
        _ => Err(Status::method_not_allowed()),
    }
}

// ---------------------------------------------------------------------------------------------
// Presenting objects

fn accept<'c>(call: &'c Call<'_>) -> Option<&'c str> {
    call.headers.get(ACCEPT).and_then(|v| v.to_str().ok())
}

fn wants_table(call: &Call<'_>) -> Option<Include> {
    table::wanted(accept(call)).then(|| Include::parse(call.params.get("includeObject")))
}

/// JSON is all a stand-in speaks; a client that takes only protobuf or CBOR gets 406.
fn check_accept(call: &Call<'_>) -> Result<(), Status> {
    let Some(accept) = accept(call).filter(|a| !a.trim().is_empty()) else { return Ok(()) };
    let ok = accept.split(',').any(|range| {
        let media = range.split(';').next().unwrap_or_default().trim().to_ascii_lowercase();
        matches!(media.as_str(), "application/json" | "*/*" | "application/*" | "application/json-seq")
    });
    if ok { Ok(()) } else { Err(Status::not_acceptable()) }
}

fn object_reply(call: &Call<'_>, r: &Resource, code: u16, object: &Value) -> Result<Reply, Status> {
    check_accept(call)?;
    let object = shown(r, object);
    Ok(match wants_table(call) {
        Some(include) => {
            let rv = object["metadata"]["resourceVersion"].as_str().unwrap_or_default().to_string();
            reply::json(code, &table::table(r, &[object], &rv, include, true))
        }
        None => reply::json(code, &object),
    })
}

// ---------------------------------------------------------------------------------------------
// Reads

fn get(instance: &Instance, call: &Call<'_>, t: &Addressed<'_>) -> Result<Reply, Status> {
    let object = instance.store.get(&t.key())?.ok_or_else(|| Status::not_found(t.target(), t.name))?;
    object_reply(call, t.r, 200, &object)
}

fn selectors(call: &Call<'_>) -> Result<(LabelSelector, FieldSelector), Status> {
    let labels = LabelSelector::parse(call.params.get("labelSelector").unwrap_or_default())
        .map_err(|e| Status::bad_request(format!("unable to parse requirement: {e}")))?;
    let fields = FieldSelector::parse(call.params.get("fieldSelector").unwrap_or_default())
        .map_err(Status::bad_request)?;
    Ok((labels, fields))
}

/// `resourceVersion` as a revision; "" and "0" (any) are None.
fn revision_param(call: &Call<'_>) -> Result<Option<u64>, Status> {
    match call.params.get("resourceVersion").unwrap_or_default() {
        "" | "0" => Ok(None),
        text => text.parse::<u64>().map(Some).map_err(|_| {
            Status::bad_request(format!(
                "invalid resource version {text:?}: strconv.ParseUint: parsing {text:?}: invalid syntax"
            ))
        }),
    }
}

fn too_large_revision(requested: u64, current: u64) -> Status {
    let mut status = Status::failure(
        504,
        "Timeout",
        format!("Too large resource version: {requested}, current: {current}"),
    );
    status.details = Some(Box::new(Details {
        causes: vec![super::status::Cause {
            reason: "ResourceVersionTooLarge",
            message: "Too large resource version".into(),
            field: String::new(),
        }],
        ..Details::default()
    }));
    status
}

/// An opaque continue token: the revision of the first page and the last key returned.
fn encode_continue(revision: u64, namespace: &str, name: &str) -> String {
    let raw = json!({"rv": revision, "start": [namespace, name]}).to_string();
    raw.bytes().map(|b| format!("{b:02x}")).collect()
}

fn decode_continue(token: &str) -> Option<(u64, String, String)> {
    let bytes: Option<Vec<u8>> = (0..token.len())
        .step_by(2)
        .map(|i| token.get(i..i + 2).and_then(|h| u8::from_str_radix(h, 16).ok()))
        .collect();
    let value: Value = serde_json::from_slice(&bytes?).ok()?;
    let start = value["start"].as_array()?;
    Some((value["rv"].as_u64()?, start.first()?.as_str()?.to_string(), start.get(1)?.as_str()?.to_string()))
}

fn list(instance: &Instance, call: &Call<'_>, t: &Addressed<'_>) -> Result<Reply, Status> {
    check_accept(call)?;
    let r = t.r;
    let (labels, fields) = selectors(call)?;
    let namespace = (!t.namespace.is_empty()).then_some(t.namespace);
    let mut after: Option<(String, String)> = None;
    let at = match call.params.get("continue").filter(|c| !c.is_empty()) {
        Some(token) => {
            let (revision, ns, name) =
                decode_continue(token).ok_or_else(|| Status::bad_request("continue key is not valid"))?;
            if revision < instance.store.compacted()? {
                return Err(Status::failure(
                    410,
                    "Expired",
                    "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter.",
                ));
            }
            after = Some((ns, name));
            Some(revision)
        }
        None => match revision_param(call)? {
            None => None,
            Some(requested) => {
                let (current, compacted) = (instance.store.revision()?, instance.store.compacted()?);
                if requested < compacted {
                    return Err(Status::expired(requested, compacted));
                }
                if requested > current {
                    return Err(too_large_revision(requested, current));
                }
                (call.params.get("resourceVersionMatch") == Some("Exact")).then_some(requested)
            }
        },
    };
    let (objects, revision) = instance.store.list(&ListQuery::new(&r.group, &r.name, namespace, at))?;
    let mut matching = objects.iter().filter(|o| labels.matches(o) && fields.matches(o)).filter(|o| {
        after.as_ref().is_none_or(|(ns, name)| {
            let meta = &o["metadata"];
            let here =
                (meta["namespace"].as_str().unwrap_or_default(), meta["name"].as_str().unwrap_or_default());
            here > (ns.as_str(), name.as_str())
        })
    });
    let limit = call.params.get("limit").and_then(|l| l.parse::<usize>().ok()).filter(|l| *l > 0);
    let items: Vec<Value> = match limit {
        Some(limit) => matching.by_ref().take(limit).map(|o| shown(r, o)).collect(),
        None => matching.by_ref().map(|o| shown(r, o)).collect(),
    };
    let remaining = matching.count();
    let mut metadata = Map::new();
    metadata.insert("resourceVersion".into(), json!(revision.to_string()));
    if remaining > 0
        && let Some(last) = items.last()
    {
        let meta = &last["metadata"];
        let token = encode_continue(
            revision,
            meta["namespace"].as_str().unwrap_or_default(),
            meta["name"].as_str().unwrap_or_default(),
        );
        metadata.insert("continue".into(), json!(token));
        metadata.insert("remainingItemCount".into(), json!(remaining));
    }
    if let Some(include) = wants_table(call) {
        let mut t = table::table(r, &items, &revision.to_string(), include, true);
        if let Some(map) = t.as_object_mut() {
            map.insert("metadata".into(), Value::Object(metadata));
        }
        return Ok(reply::json(200, &t));
    }
    Ok(reply::json(
        200,
        &json!({"kind": format!("{}List", r.kind), "apiVersion": r.api_version(), "metadata": metadata, "items": items}),
    ))
}

fn watch_objects(instance: &Instance, call: &Call<'_>, t: &Addressed<'_>) -> Result<Reply, Status> {
    check_accept(call)?;
    let (labels, fields) = selectors(call)?;
    let initial = call.params.flag("sendInitialEvents");
    // kube-apiserver refuses the parameter, whatever its value, without the feature.
    if call.params.get("sendInitialEvents").is_some() && !instance.profile.watch_list() {
        return Err(Status::watch_list_forbidden());
    }
    let start = match (initial, revision_param(call)?) {
        (Some(true), _) => Start::Current { end_bookmark: true },
        (Some(false), None) => Start::After(instance.store.revision()?),
        (_, Some(revision)) => Start::After(revision),
        (None, None) => Start::Current { end_bookmark: false },
    };
    let timeout = call
        .params
        .get("timeoutSeconds")
        .and_then(|s| s.parse::<u64>().ok())
        .filter(|s| *s > 0)
        .map(Duration::from_secs);
    let spec = watch::Spec {
        resource: t.r.clone(),
        namespace: (!t.namespace.is_empty()).then(|| t.namespace.to_string()),
        name: (!t.name.is_empty()).then(|| t.name.to_string()),
        labels,
        fields,
        start,
        bookmarks: call.params.flag("allowWatchBookmarks") == Some(true),
        bookmark_interval: instance.bookmark_interval,
        timeout,
        table: wants_table(call),
    };
    Ok(watch::serve(instance.store.clone(), spec, instance.stopping.clone()))
}

// ---------------------------------------------------------------------------------------------
// Writes

fn dry_run(call: &Call<'_>) -> bool {
    call.params.get("dryRun").is_some_and(|v| !v.is_empty())
}

/// The request body as a JSON object of this resource's group.
fn create(instance: &Instance, call: &Call<'_>, t: &Addressed<'_>) -> Result<Reply, Status> {
    let r = t.r;
    let body = body_object(call, r)?;
    let mut object = new_object(r, t.namespace, body)?;
    drop_disabled_fields(&instance.profile, r, None, &mut object);
    let name = text_at(&object, "name").to_string();
    let key = Key::new(&r.group, &r.name, t.namespace, &name);
    let target = t.target();
    // Moved into the write, not cloned: a remote store asks again only after another writer
    // of this name won the race, and "already exists" is a correct answer then.
    let mut object = Some(object);
    let created = instance.store.write(&key, t.required_namespace(), dry_run(call), |current| {
        if current.is_some() {
            return Err(Status::already_exists(target, &name));
        }
        object.take().map(Write::Put).ok_or_else(|| Status::already_exists(target, &name))
    })?;
    let created = created.ok_or_else(|| Status::internal("create wrote nothing"))?;
    object_reply(call, r, 201, &created)
}

fn update(instance: &Instance, call: &Call<'_>, t: &Addressed<'_>) -> Result<Reply, Status> {
    let r = t.r;
    let body = body_object(call, r)?;
    let body_namespace = text_at(&body, "namespace");
    if r.namespaced && !body_namespace.is_empty() && body_namespace != t.namespace {
        return Err(Status::bad_request(
            "the namespace of the provided object does not match the namespace sent on the request",
        ));
    }
    if text_at(&body, "name") != t.name {
        return Err(Status::bad_request(format!(
            "the name of the object ({}) does not match the name on the URL ({})",
            text_at(&body, "name"),
            t.name
        )));
    }
    let target = t.target();
    let written = instance.store.write(&t.key(), None, dry_run(call), |current| {
        let current = current.ok_or_else(|| Status::not_found(target, t.name))?;
        let wanted_rv = text_at(&body, "resourceVersion");
        let wanted_uid = text_at(&body, "uid");
        if (!wanted_rv.is_empty() && wanted_rv != text_at(current, "resourceVersion"))
            || (!wanted_uid.is_empty() && wanted_uid != text_at(current, "uid"))
        {
            return Err(Status::conflict(target, t.name));
        }
        let mut body = body.clone();
        drop_disabled_fields(&instance.profile, r, Some(current), &mut body);
        Ok(match updated_object(r, current, body, t.status)? {
            Some(next) => Write::Put(next),
            None => Write::Unchanged,
        })
    })?;
    let written = written.ok_or_else(|| Status::not_found(target, t.name))?;
    object_reply(call, r, 200, &written)
}

fn patch_object(instance: &Instance, call: &Call<'_>, t: &Addressed<'_>) -> Result<Reply, Status> {
    let r = t.r;
    let content_type = call.headers.get(CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or_default();
    let kind = PatchType::from_content_type(content_type)
        .ok_or_else(|| Status::unsupported_media_type(content_type, &patch::ACCEPTED))?;
    let patch_body = patch::parse(kind, &call.body)?;
    let target = t.target();
    let mut created = false;
    let written = instance.store.write(&t.key(), t.required_namespace(), dry_run(call), |current| {
        // A remote store may ask again after losing a race: only the last answer counts.
        created = false;
        let Some(current) = current else {
            if kind != PatchType::Apply || t.status {
                return Err(Status::not_found(target, t.name));
            }
            // Server-side apply creates what is missing.
            check_type(&patch_body, r)?;
            let mut seed = patch_body.clone();
            if let Some(meta) = metadata_mut(&mut seed) {
                meta.insert("name".into(), json!(t.name));
            }
            created = true;
            let mut object = new_object(r, t.namespace, seed)?;
            drop_disabled_fields(&instance.profile, r, None, &mut object);
            return Ok(Write::Put(object));
        };
        let before = shown(r, current);
        let patched = patch::apply(kind, &before, &patch_body)?;
        if !patched.is_object() {
            return Err(Status::bad_request("the patched object is not a JSON object"));
        }
        if text_at(&patched, "resourceVersion") != text_at(current, "resourceVersion") {
            return Err(Status::conflict(target, t.name));
        }
        if text_at(&patched, "name") != t.name {
            return Err(Status::invalid(
                &r.kind,
                &r.group,
                t.name,
                "metadata.name",
                "Invalid value: field is immutable",
            ));
        }
        let mut patched = patched;
        if let Some(map) = patched.as_object_mut() {
            map.insert("apiVersion".into(), current["apiVersion"].clone());
        }
        drop_disabled_fields(&instance.profile, r, Some(current), &mut patched);
        Ok(match updated_object(r, current, patched, t.status)? {
            Some(next) => Write::Put(next),
            None => Write::Unchanged,
        })
    })?;
    let written = written.ok_or_else(|| Status::not_found(target, t.name))?;
    object_reply(call, r, if created { 201 } else { 200 }, &written)
}

fn delete(instance: &Instance, call: &Call<'_>, t: &Addressed<'_>) -> Result<Reply, Status> {
    let r = t.r;
    let options: Value =
        if call.body.iter().all(u8::is_ascii_whitespace) { json!({}) } else { decode_body(call)? };
    let is_namespace = r.group.is_empty() && r.name == "namespaces";
    let target = t.target();
    if is_namespace && UNDELETABLE_NAMESPACES.contains(&t.name) {
        return Err(Status::forbidden(target, t.name, "this namespace may not be deleted"));
    }
    let dry = dry_run(call) || options["dryRun"].as_array().is_some_and(|a| !a.is_empty());
    let preconditions = &options["preconditions"];
    let deleted = instance.store.write(&t.key(), None, dry, |current| {
        let current = current.ok_or_else(|| Status::not_found(target, t.name))?;
        let rv_ok = preconditions["resourceVersion"]
            .as_str()
            .is_none_or(|rv| rv == text_at(current, "resourceVersion"));
        let uid_ok = preconditions["uid"].as_str().is_none_or(|uid| uid == text_at(current, "uid"));
        if !rv_ok || !uid_ok {
            return Err(Status::conflict(target, t.name));
        }
        Ok(if is_namespace { Write::DeleteNamespace } else { Write::Delete })
    })?;
    let deleted = deleted.ok_or_else(|| Status::not_found(target, t.name))?;
    if is_namespace {
        let mut last = (*deleted).clone();
        if let Some(map) = last.as_object_mut() {
            map.insert("status".into(), json!({"phase": "Terminating"}));
        }
        if let Some(meta) = metadata_mut(&mut last) {
            meta.insert("deletionTimestamp".into(), json!(clock::now_rfc3339()));
        }
        return object_reply(call, r, 200, &last);
    }
    let details = Details {
        name: t.name.to_string(),
        group: r.group.clone(),
        kind: r.name.clone(),
        uid: text_at(&deleted, "uid").to_string(),
        ..Details::default()
    };
    Ok(reply::json(200, &Status::success(details)))
}

fn delete_collection(instance: &Instance, call: &Call<'_>, t: &Addressed<'_>) -> Result<Reply, Status> {
    let r = t.r;
    let (labels, fields) = selectors(call)?;
    let namespace = (!t.namespace.is_empty()).then_some(t.namespace);
    let (objects, _) = instance.store.list(&ListQuery::new(&r.group, &r.name, namespace, None))?;
    let mut items = Vec::new();
    for object in objects.iter().filter(|o| labels.matches(o) && fields.matches(o)) {
        let key = Key::new(&r.group, &r.name, text_at(object, "namespace"), text_at(object, "name"));
        // Gone since the list: someone else deleted it, which is what was wanted.
        if let Ok(Some(deleted)) = instance.store.write(&key, None, dry_run(call), |current| {
            Ok(if current.is_some() { Write::Delete } else { Write::Unchanged })
        }) {
            items.push(shown(r, &deleted));
        }
    }
    let revision = instance.store.revision()?.to_string();
    Ok(reply::json(
        200,
        &json!({"kind": format!("{}List", r.kind), "apiVersion": r.api_version(), "metadata": {"resourceVersion": revision}, "items": items}),
    ))
}

// ---------------------------------------------------------------------------------------------
// Create-only resources (reviews, bindings, ...): answered, never stored.

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn continue_tokens_round_trip() {
        let token = encode_continue(42, "default", "x");
        assert_eq!(decode_continue(&token), Some((42, "default".into(), "x".into())));
        assert_eq!(decode_continue("zz"), None);
        assert_eq!(decode_continue(""), None);
    }
}
