//! OpenAPI as kube-apiserver serves it (kube-openapi's `handler` and `handler3`): `/openapi/v2`
//! and the `/openapi/v3` index with one document per group/version, each addressed with
//! `?hash=<SHA-512>` and cached accordingly (hash match: `public, immutable`; another hash: a 301
//! to the right one; `If-None-Match`: 304).
//!
//! The real profiles serve the captured documents as they are. The era profiles serve, per
//! group/version, the captured document of the nearest real server (1.36 first for the 1.36
//! era, the emulated 1.33 first otherwise) with the paths of resources the era does not serve
//! left out and hand-made ones added for resources the capture lacks; group/versions no real
//! server captured get a hand-made document, shaped like upstream's: kubectl reads the index to
//! find a group/version's document, checks a resource's PATCH operation for the
//! `fieldValidation` parameter (server-side field validation), and `kubectl explain` finds the
//! kind through an operation's `x-kubernetes-group-version-kind` and then the schema carrying
//! the same GVK.
//!
//! v2 in protobuf (`com.github.proto-openapi.spec.v2@v1.0+protobuf`) is a reduced encoding of
//! the v2 JSON ([`super::openapi_proto`]: names, descriptions, types, GVKs; no operations).
//! Not modelled: v3 in protobuf (`com.github.proto-openapi.spec.v3.v1.0+protobuf`): a request
//! that accepts nothing else gets the 406 upstream gives unknown types; v2's gzip; byte ranges other than one `bytes=A-B`.

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, SystemTime};

use anyhow::{Context, Result, anyhow};
use bytes::Bytes;
use hyper::HeaderMap;
use hyper::header::{
    ACCEPT, CACHE_CONTROL, CONTENT_RANGE, CONTENT_TYPE, ETAG, EXPIRES, HeaderValue, IF_MODIFIED_SINCE,
    IF_NONE_MATCH, LAST_MODIFIED, LOCATION, RANGE, VARY,
};
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha512};

use super::captured::{self, Capture, Documents};
use super::catalog::{Catalog, Resource};
use super::params::Params;
use super::profile::Profile;
use super::reply::{self, Reply};

const META: &str = "io.k8s.apimachinery.pkg.apis.meta.v1";
/// The one form of the documents a stand-in has.
const JSON: (&str, &str) = ("application", "json");

/// One document and its ETag (`%X` of its SHA-512, as kube-openapi's `computeETag`).
#[derive(Debug, Clone)]
struct Doc {
    body: Bytes,
    etag: String,
}

impl Doc {
    fn new(body: Bytes) -> Doc {
        let etag = Sha512::digest(&body).iter().fold(String::with_capacity(128), |mut hex, byte| {
            let _ = write!(hex, "{byte:02X}");
            hex
        });
        Doc { body, etag }
    }
}

/// The v3 index, every document it lists and v2, built once per profile and process.
pub struct OpenApi {
    index: Doc,
    /// `api/v1`, `apis/<g>/<v>`, `apis/<g>`, `version`, ... → document.
    documents: HashMap<String, Doc>,
    v2: Doc,
    v2_proto: Doc,
    /// `Last-Modified`.
    built: SystemTime,
}

impl OpenApi {
    /// The documents of `profile` (whose resources `catalog` holds), shared by every stand-in
    /// of the same profile in this process.
    pub fn for_profile(profile: &Profile, catalog: &Catalog) -> Result<Arc<OpenApi>> {
        static BUILT: OnceLock<Mutex<HashMap<String, Arc<OpenApi>>>> = OnceLock::new();
        let served: Vec<String> = catalog.group_versions().map(|(g, v)| format!("{g}/{v}")).collect();
        let key = format!("{} {}", profile.name(), served.join(","));
        let mut built = BUILT.get_or_init(Mutex::default).lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(found) = built.get(&key) {
            return Ok(found.clone());
        }
        let openapi = Arc::new(match profile.capture {
            Some(capture) => OpenApi::captured(capture)?,
            None => OpenApi::derived(profile, catalog)?,
        });
        built.insert(key, openapi.clone());
        Ok(openapi)
    }

    fn captured(capture: Capture) -> Result<OpenApi> {
        let documents = captured::documents(capture)?;
        let mut served = HashMap::new();
        for (key, etag) in index_hashes(documents)? {
            let body = documents.openapi_v3(&key).with_context(|| format!("no captured {key}"))?;
            served.insert(key, Doc { body: body.clone(), etag });
        }
        Ok(OpenApi {
            index: Doc::new(documents.file("openapi/v3/index.json")?.clone()),
            documents: served,
            v2: Doc::new(documents.file("openapi/v2.json")?.clone()),
            v2_proto: proto_of(documents.file("openapi/v2.json")?)?,
            built: SystemTime::now(),
        })
    }

    fn derived(profile: &Profile, catalog: &Catalog) -> Result<OpenApi> {
        let order = match profile.era.as_str() {
            "1.36" => [Capture::Native136, Capture::Emulated133],
            _ => [Capture::Emulated133, Capture::Native136],
        };
        let mut sources = Vec::new();
        for capture in order {
            let documents = captured::documents(capture)?;
            sources.push((documents, index_hashes(documents)?));
        }
        let mut served = HashMap::new();
        let mut groups = HashSet::new();
        for (group, version) in catalog.group_versions() {
            groups.insert(group);
            let key = group_version_key(group, version);
            let resources = catalog.resources_of(group, version);
            let real = sources.iter().find_map(|(documents, hashes)| {
                Some((documents.openapi_v3(&key)?, hashes.get(&key)?.clone()))
            });
            let doc = match real {
                Some((body, etag)) => adapted(body, etag, &resources, group, version)
                    .with_context(|| format!("captured OpenAPI of {key}"))?,
                None => Doc::new(to_bytes(&handmade_document(&resources, group, version, &profile.era))),
            };
            served.insert(key, doc);
        }
        // The documents that are not a group/version's: `api`, `apis`, `version`, OIDC, and
        // one per served group.
        for (documents, hashes) in &sources {
            for (key, etag) in hashes {
                let segments: Vec<&str> = key.split('/').collect();
                let wanted = match segments.as_slice() {
                    ["api", _] | ["apis", _, _] => false,
                    ["apis", group] => groups.contains(group),
                    _ => true,
                };
                if wanted && !served.contains_key(key) {
                    let body = documents.openapi_v3(key).with_context(|| format!("no captured {key}"))?;
                    served.insert(key.clone(), Doc { body: body.clone(), etag: etag.clone() });
                }
            }
        }
        let mut paths = Map::new();
        for (key, doc) in &served {
            paths.insert(key.clone(), json!({"serverRelativeURL": server_relative_url(key, &doc.etag)}));
        }
        let (first, _) = sources.first().ok_or_else(|| anyhow!("no captured server"))?;
        Ok(OpenApi {
            index: Doc::new(to_bytes(&json!({ "paths": paths }))),
            documents: served,
            v2: Doc::new(first.file("openapi/v2.json")?.clone()),
            v2_proto: proto_of(first.file("openapi/v2.json")?)?,
            built: SystemTime::now(),
        })
    }

    /// Answers a GET of `/openapi/v2`, `/openapi/v3` or `/openapi/v3/<key>`; None for any
    /// other path.
    pub fn respond(&self, path: &str, query: &str, headers: &HeaderMap) -> Option<Reply> {
        match path {
            "/openapi/v2" => Some(self.v2_reply(headers)),
            "/openapi/v3" => Some(serve_content(&self.index, headers, self.built)),
            _ => path.strip_prefix("/openapi/v3/").map(|key| self.v3_reply(key, query, headers)),
        }
    }

    fn v2_reply(&self, headers: &HeaderMap) -> Reply {
        let mut resp = match (prefers_v2_proto(headers), accepts_json(headers)) {
            (true, _) => {
                let mut resp = serve_content(&self.v2_proto, headers, self.built);
                if matches!(resp.status().as_u16(), 200 | 206) {
                    resp.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static(V2_PROTO));
                }
                resp
            }
            (false, true) => serve_content(&self.v2, headers, self.built),
            (false, false) => reply::empty(406),
        };
        resp.headers_mut().insert(VARY, HeaderValue::from_static("Accept"));
        resp
    }

    fn v3_reply(&self, key: &str, query: &str, headers: &HeaderMap) -> Reply {
        let mut resp = self.v3_document(key, query, headers);
        resp.headers_mut().insert(VARY, HeaderValue::from_static("Accept"));
        resp
    }

    fn v3_document(&self, key: &str, query: &str, headers: &HeaderMap) -> Reply {
        if !accepts_json(headers) {
            return reply::empty(406);
        }
        // Upstream's handler returns without writing anything: 200 with an empty body.
        let Some(doc) = self.documents.get(key) else { return reply::empty(200) };
        let params = Params::parse(query);
        let Some(hash) = params.get("hash").filter(|h| !h.is_empty()) else {
            return serve_content(doc, headers, self.built);
        };
        if hash != doc.etag {
            // http.Redirect with a Content-Type already set: no body.
            let mut resp = reply::empty(301);
            let h = resp.headers_mut();
            if let Ok(location) = HeaderValue::from_str(&server_relative_url(key, &doc.etag)) {
                h.insert(LOCATION, location);
            }
            h.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
            if let Ok(tag) = HeaderValue::from_str(&format!("\"{}\"", doc.etag)) {
                h.insert(ETAG, tag);
            }
            return resp;
        }
        let mut resp = serve_content(doc, headers, self.built);
        let h = resp.headers_mut();
        h.insert(CACHE_CONTROL, HeaderValue::from_static("public, immutable"));
        let expires = SystemTime::now() + Duration::from_secs(365 * 24 * 3600);
        if let Ok(value) = HeaderValue::from_str(&httpdate::fmt_http_date(expires).replace("GMT", "UTC")) {
            h.insert(EXPIRES, value);
        }
        resp
    }

    #[cfg(test)]
    fn document(&self, key: &str) -> Option<&Doc> {
        self.documents.get(key)
    }
}

/// `/openapi/v3/<key>?hash=<etag>`, as kube-openapi's `constructServerRelativeURL`.
fn server_relative_url(key: &str, etag: &str) -> String {
    format!("/openapi/v3/{}?hash={etag}", key.trim_matches('/'))
}

/// The index's keys and the hashes of their `serverRelativeURL`s.
fn index_hashes(documents: &Documents) -> Result<HashMap<String, String>> {
    let index: Value = serde_json::from_slice(documents.file("openapi/v3/index.json")?)?;
    let paths = index["paths"].as_object().context("the captured index has no paths")?;
    let mut hashes = HashMap::new();
    for (key, entry) in paths {
        let url = entry["serverRelativeURL"].as_str().unwrap_or_default();
        let (_, hash) = url.split_once("?hash=").with_context(|| format!("{key}: no hash in {url:?}"))?;
        hashes.insert(key.clone(), hash.to_string());
    }
    Ok(hashes)
}

fn group_version_key(group: &str, version: &str) -> String {
    if group.is_empty() { format!("api/{version}") } else { format!("apis/{group}/{version}") }
}

fn to_bytes(value: &Value) -> Bytes {
    serde_json::to_vec(value).unwrap_or_default().into()
}

const V2_PROTO: &str = "application/com.github.proto-openapi.spec.v2@v1.0+protobuf";

fn proto_of(v2_json: &Bytes) -> Result<Doc> {
    Ok(Doc::new(super::openapi_proto::reduced(&serde_json::from_slice(v2_json)?).into()))
}

/// Whether the first acceptable `Accept` clause for v2 names its protobuf form.
fn prefers_v2_proto(headers: &HeaderMap) -> bool {
    let accept = headers.get(ACCEPT).and_then(|v| v.to_str().ok()).unwrap_or("*/*");
    let chosen = accept
        .split(',')
        .map(|c| c.split(';').next().unwrap_or_default().trim().to_ascii_lowercase())
        .find(|m| matches!(m.as_str(), "application/json" | "application/*" | "*/*") || m == V2_PROTO);
    chosen.as_deref() == Some(V2_PROTO)
}

/// Whether an `Accept` header (goautoneg's clause order: quality, then specificity) reaches JSON
/// before anything else: the protobuf forms upstream would serve first are not modelled, so
/// they are passed over.
fn accepts_json(headers: &HeaderMap) -> bool {
    let accept = headers.get(ACCEPT).and_then(|v| v.to_str().ok()).filter(|a| !a.trim().is_empty());
    let accept = accept.unwrap_or("*/*");
    accept.split(',').any(|clause| {
        let mut parts = clause.split(';');
        let media = parts.next().unwrap_or_default().trim().to_ascii_lowercase();
        let q_zero = parts.any(|p| {
            p.split_once('=').is_some_and(|(n, v)| n.trim() == "q" && v.trim().parse::<f32>() == Ok(0.0))
        });
        let (kind, subtype) = media.split_once('/').unwrap_or((media.as_str(), ""));
        !q_zero && (kind == JSON.0 || kind == "*") && (subtype == JSON.1 || subtype == "*")
    })
}

/// Go's `http.ServeContent` for a document with an ETag: `Last-Modified`, and 304 for a
/// matching `If-None-Match` (or, without one, an `If-Modified-Since` not before `built`).
fn serve_content(doc: &Doc, headers: &HeaderMap, built: SystemTime) -> Reply {
    let quoted = format!("\"{}\"", doc.etag);
    let header = |name| headers.get(name).and_then(|v: &HeaderValue| v.to_str().ok());
    let not_modified = match header(IF_NONE_MATCH) {
        Some(tags) => {
            tags.split(',').map(str::trim).any(|t| t == "*" || t.trim_start_matches("W/") == quoted)
        }
        None => header(IF_MODIFIED_SINCE)
            .and_then(|since| httpdate::parse_http_date(since).ok())
            .is_some_and(|since| {
                let built = httpdate::parse_http_date(&httpdate::fmt_http_date(built)).unwrap_or(built);
                built <= since
            }),
    };
    let range = header(RANGE).and_then(|r| single_range(r, doc.body.len() as u64));
    let mut resp = if not_modified {
        reply::empty(304)
    } else if let Some(range) = range {
        // Go's ServeContent: one satisfiable range → 206, an unsatisfiable one → 416.
        let mut resp = match range {
            Some((start, end)) => {
                let body = doc.body.slice(start as usize..=end as usize);
                let mut resp = reply::bytes(206, "application/json", body);
                let content_range = format!("bytes {start}-{end}/{}", doc.body.len());
                if let Ok(value) = HeaderValue::from_str(&content_range) {
                    resp.headers_mut().insert(CONTENT_RANGE, value);
                }
                resp
            }
            None => reply::empty(416),
        };
        if let Ok(value) = HeaderValue::from_str(&httpdate::fmt_http_date(built)) {
            resp.headers_mut().insert(LAST_MODIFIED, value);
        }
        resp
    } else {
        let mut resp = reply::bytes(200, "application/json", doc.body.clone());
        if let Ok(value) = HeaderValue::from_str(&httpdate::fmt_http_date(built)) {
            resp.headers_mut().insert(LAST_MODIFIED, value);
        }
        resp
    };
    if let Ok(tag) = HeaderValue::from_str(&quoted) {
        resp.headers_mut().insert(ETAG, tag);
    }
    resp
}

/// `bytes=A-B` (or `bytes=A-`): Some(Some(range)) within a body of `len` bytes, Some(None) when
/// it cannot be satisfied; None for anything else (no range, several, suffix ranges: the whole
/// document, as a stand-in keeps it simple).
fn single_range(header: &str, len: u64) -> Option<Option<(u64, u64)>> {
    let spec = header.trim().strip_prefix("bytes=")?;
    let (start, end) = spec.split_once('-')?;
    let start: u64 = start.trim().parse().ok()?;
    let end: u64 = match end.trim() {
        "" => len.saturating_sub(1),
        e => e.parse().ok()?,
    };
    Some((start < len && start <= end).then(|| (start, end.min(len - 1))))
}

/// A captured group/version document fitted to the resources an era serves there: paths of
/// other resources left out, hand-made ones for resources the capture lacks; unchanged (bytes
/// and hash) when it already fits.
fn adapted(real: &Bytes, etag: String, resources: &[&Resource], group: &str, version: &str) -> Result<Doc> {
    let mut doc: Value = serde_json::from_slice(real)?;
    let served: HashSet<&str> = resources.iter().map(|r| r.name.as_str()).collect();
    let prefix = group_version_key(group, version);
    let paths = doc["paths"].as_object_mut().context("no paths")?;
    let before = paths.len();
    let mut documented = HashSet::new();
    paths.retain(|path, _| match path_resource(path, &prefix) {
        Some(resource) => {
            documented.insert(resource.to_string());
            served.contains(resource)
        }
        None => true,
    });
    let missing: Vec<&Resource> =
        resources.iter().filter(|r| !documented.contains(&r.name)).copied().collect();
    if paths.len() == before && missing.is_empty() {
        return Ok(Doc { body: real.clone(), etag });
    }
    let (more_paths, more_schemas) = handmade_parts(&missing, group, version);
    paths.extend(more_paths);
    if let Some(schemas) = doc["components"]["schemas"].as_object_mut() {
        for (name, schema) in more_schemas {
            schemas.entry(name).or_insert(schema);
        }
    }
    Ok(Doc::new(to_bytes(&doc)))
}

/// The resource a path of a group/version document is about (`/apis/<g>/<v>/[watch/]
/// [namespaces/{namespace}/]<resource>[/...]`); None for the group/version's own path.
fn path_resource<'p>(path: &'p str, key: &str) -> Option<&'p str> {
    let rest = path.strip_prefix('/')?.strip_prefix(key)?.strip_prefix('/')?;
    let rest = rest.strip_prefix("watch/").unwrap_or(rest);
    let segments: Vec<&str> = rest.split('/').collect();
    match segments.as_slice() {
        [""] | [] => None,
        ["namespaces", "{namespace}", resource, ..] => Some(resource),
        [resource, ..] => Some(resource),
    }
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

/// One operation a hand-made path offers, as kube-apiserver's OpenAPI builder describes it.
struct Op {
    method: &'static str,
    /// `x-kubernetes-action`.
    action: &'static str,
    /// The resource's verbs that make it offered: any one of them.
    enabled_by: &'static [&'static str],
    input: Input,
    answer: Answer,
}

/// What an operation takes besides the path parameters.
#[derive(Clone, Copy)]
enum Input {
    Nothing,
    ListOptions,
    /// The whole object, with the write options.
    Object,
    /// A patch of it, with the write options and `force`.
    Patch,
    DryRun,
}

/// What an operation answers.
#[derive(Clone, Copy)]
enum Answer {
    Object,
    /// The object, 200 or 201 Created.
    Written,
    List,
    Status,
}

const fn op(
    method: &'static str,
    action: &'static str,
    enabled_by: &'static [&'static str],
    input: Input,
    answer: Answer,
) -> Op {
    Op { method, action, enabled_by, input, answer }
}

impl Op {
    /// The verb that starts its `operationId`: upstream names reads, replacements and
    /// creations after the REST verb, the rest after the action.
    fn id_verb(&self) -> &'static str {
        match self.action {
            "get" => "read",
            "put" => "replace",
            "post" => "create",
            action => action,
        }
    }
}

const READ: Op = op("get", "get", &["get"], Input::Nothing, Answer::Object);
const REPLACE: Op = op("put", "put", &["update"], Input::Object, Answer::Written);
const PATCH: Op = op("patch", "patch", &["patch"], Input::Patch, Answer::Written);
/// `/<resource>`.
const COLLECTION_OPS: &[Op] = &[
    op("get", "list", &["list", "watch"], Input::ListOptions, Answer::List),
    op("post", "post", &["create"], Input::Object, Answer::Written),
    op("delete", "deletecollection", &["deletecollection"], Input::ListOptions, Answer::Status),
];
/// `/<resource>/{name}`.
const ITEM_OPS: &[Op] =
    &[READ, REPLACE, PATCH, op("delete", "delete", &["delete"], Input::DryRun, Answer::Status)];
/// `/<resource>/{name}/status`.
const STATUS_OPS: &[Op] = &[READ, REPLACE, PATCH];

/// What one resource's operations have in common.
struct OpContext<'a> {
    tag: &'a str,
    gvk: Value,
    /// The rest of every `operationId`: the kind, then `Namespaced` for a namespaced resource.
    id_kind: String,
    kind_schema: String,
}

impl OpContext<'_> {
    /// The operations of `ops` that `verbs` enable, by HTTP method.
    fn offered(&self, ops: &[Op], verbs: &[String]) -> Map<String, Value> {
        ops.iter()
            .filter(|op| op.enabled_by.iter().any(|e| verbs.iter().any(|v| v == e)))
            .map(|op| (op.method.to_string(), self.to_json(op)))
            .collect()
    }

    fn to_json(&self, op: &Op) -> Value {
        let kind_schema = &self.kind_schema;
        let (parameters, body) = match op.input {
            Input::Nothing => (vec![], None),
            Input::ListOptions => (list_parameters(), None),
            Input::Object => (write_parameters(false), Some((vec!["*/*"], kind_schema.clone()))),
            Input::Patch => (write_parameters(true), Some((PATCH_TYPES.to_vec(), format!("{META}.Patch")))),
            Input::DryRun => (vec![query("dryRun", "string", "")], None),
        };
        let responses = match op.answer {
            Answer::Object => ok(kind_schema, &["200"]),
            Answer::Written => ok(kind_schema, &["200", "201"]),
            Answer::List => ok(&format!("{kind_schema}List"), &["200"]),
            Answer::Status => ok(&format!("{META}.Status"), &["200"]),
        };
        let mut json = json!({
            "tags": [self.tag],
            "description": format!("{} {}", op.action, self.gvk["kind"].as_str().unwrap_or_default()),
            "operationId": format!("{}{}", op.id_verb(), self.id_kind),
            "parameters": parameters,
            "responses": responses,
            "x-kubernetes-action": op.action,
            "x-kubernetes-group-version-kind": self.gvk,
        });
        if let (Some((types, schema)), Some(map)) = (body, json.as_object_mut()) {
            let content: Map<String, Value> =
                types.iter().map(|t| ((*t).to_string(), json!({"schema": reference(&schema)}))).collect();
            map.insert("requestBody".into(), json!({"content": content, "required": true}));
        }
        json
    }
}

const PATCH_TYPES: [&str; 3] =
    ["application/json-patch+json", "application/merge-patch+json", "application/apply-patch+yaml"];

/// A whole hand-made document for a group/version no real server was captured serving.
fn handmade_document(resources: &[&Resource], group: &str, version: &str, era: &str) -> Value {
    let (paths, schemas) = handmade_parts(resources, group, version);
    json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": era},
        "paths": paths,
        "components": {"schemas": schemas},
    })
}

/// Hand-made paths and schemas (with the meta ones they refer to) of `resources`.
fn handmade_parts(
    resources: &[&Resource],
    group: &str,
    version: &str,
) -> (Map<String, Value>, Map<String, Value>) {
    let prefix =
        if group.is_empty() { format!("/api/{version}") } else { format!("/apis/{group}/{version}") };
    let tag = format!(
        "{}_{version}",
        if group.is_empty() { "core" } else { group.split('.').next().unwrap_or(group) }
    );
    let mut paths = Map::new();
    let mut schemas = meta_schemas();
    for r in resources.iter().copied() {
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
        let ops = OpContext {
            tag: &tag,
            gvk: gvk(group, version, &r.kind),
            id_kind: format!("{}{}", r.kind, if r.namespaced { "Namespaced" } else { "" }),
            kind_schema,
        };
        let mut collection = ops.offered(COLLECTION_OPS, &r.verbs);
        let mut item = ops.offered(ITEM_OPS, &r.verbs);
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
            let mut status_ops = ops.offered(STATUS_OPS, &status.verbs);
            status_ops.insert("parameters".into(), path_parameters(r.namespaced, true));
            paths.insert(format!("{base}/{{name}}/status"), Value::Object(status_ops));
        }
    }
    (paths, schemas)
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

    fn openapi(spec: &str) -> Arc<OpenApi> {
        let profile = Profile::parse(spec).unwrap();
        OpenApi::for_profile(&profile, &Catalog::new(&profile)).unwrap()
    }

    fn doc(openapi: &OpenApi, key: &str) -> Value {
        serde_json::from_slice(&openapi.document(key).unwrap().body).unwrap()
    }

    fn index(openapi: &OpenApi) -> Value {
        serde_json::from_slice(&openapi.index.body).unwrap()
    }

    #[test]
    fn real_profiles_serve_the_captured_documents_with_their_hashes() {
        for (spec, capture) in [("1.36-real", Capture::Native136), ("1.33-real", Capture::Emulated133)] {
            let openapi = openapi(spec);
            let documents = captured::documents(capture).unwrap();
            assert_eq!(openapi.index.body, documents.files()["openapi/v3/index.json"]);
            assert_eq!(openapi.v2.body, documents.files()["openapi/v2.json"]);
            let listed = index(&openapi)["paths"].as_object().unwrap().len();
            assert_eq!(openapi.documents.len(), listed);
            for (key, served) in &openapi.documents {
                // The hash in the index is the SHA-512 of the document, as kube-openapi makes it.
                assert_eq!(served.etag, Doc::new(served.body.clone()).etag, "{spec} {key}");
                assert_eq!(Some(&served.body), documents.openapi_v3(key), "{spec} {key}");
            }
        }
        assert_eq!(openapi("1.36-real").documents.len(), 47);
        assert_eq!(openapi("1.33-real").documents.len(), 52);
    }

    #[test]
    fn era_documents_come_from_the_nearest_real_server() {
        let era = openapi("1.36:disable=resource.k8s.io/v1beta1");
        let index = index(&era);
        let url = index["paths"]["apis/resource.k8s.io/v1"]["serverRelativeURL"].as_str().unwrap();
        let hash = url.strip_prefix("/openapi/v3/apis/resource.k8s.io/v1?hash=").unwrap();
        assert_eq!(hash, era.document("apis/resource.k8s.io/v1").unwrap().etag);
        assert_eq!(hash.len(), 128);
        assert!(index["paths"]["api/v1"].is_object() && index["paths"]["version"].is_object());
        assert!(index["paths"].get("apis/resource.k8s.io/v1beta1").is_none());
        assert!(era.document("apis/resource.k8s.io/v1beta1").is_none());
        // The real schema, nested fields and all (what `explain ...requests.exactly` reads)...
        let dra = doc(&era, "apis/resource.k8s.io/v1");
        let schemas = &dra["components"]["schemas"];
        assert!(schemas["io.k8s.api.resource.v1.DeviceRequest"]["properties"]["exactly"].is_object());
        // ...plus what the era serves and the capture lacks, hand-made.
        let taint_rules = &dra["paths"]["/apis/resource.k8s.io/v1/devicetaintrules/{name}"];
        assert_eq!(taint_rules["get"]["x-kubernetes-group-version-kind"]["kind"], "DeviceTaintRule");
        // The 1.33 era has no volumeattributesclasses in storage.k8s.io/v1: its paths go.
        let storage = doc(&openapi("1.33"), "apis/storage.k8s.io/v1");
        let paths = storage["paths"].as_object().unwrap();
        assert!(paths.keys().any(|p| p.ends_with("/storageclasses/{name}")));
        assert!(!paths.keys().any(|p| p.contains("volumeattributesclasses")));
        // A group/version no real server was captured serving: hand-made.
        let alpha = doc(&openapi("1.33"), "apis/resource.k8s.io/v1alpha3");
        assert_eq!(alpha["info"]["version"], "1.33");
        // Documents that fit are the captured bytes, hash included.
        let apps = era.document("apis/apps/v1").unwrap();
        let real = captured::documents(Capture::Native136).unwrap().openapi_v3("apis/apps/v1").unwrap();
        assert_eq!(&apps.body, real);
    }

    #[test]
    fn paths_name_their_resource() {
        let key = "apis/resource.k8s.io/v1";
        for (path, resource) in [
            ("/apis/resource.k8s.io/v1/", None),
            ("/apis/resource.k8s.io/v1/deviceclasses", Some("deviceclasses")),
            ("/apis/resource.k8s.io/v1/watch/deviceclasses/{name}", Some("deviceclasses")),
            (
                "/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}/status",
                Some("resourceclaims"),
            ),
            ("/apis/resource.k8s.io/v1/watch/namespaces/{namespace}/resourceclaims", Some("resourceclaims")),
            ("/apis/resource.k8s.io/v1beta1/deviceclasses", None),
        ] {
            assert_eq!(path_resource(path, key), resource, "{path}");
        }
        assert_eq!(path_resource("/api/v1/namespaces/{name}/finalize", "api/v1"), Some("namespaces"));
        assert_eq!(path_resource("/api/v1/namespaces", "api/v1"), Some("namespaces"));
    }

    #[test]
    fn handmade_patch_operations_carry_field_validation_and_the_gvk() {
        let profile = Profile::parse("1.33").unwrap();
        let catalog = Catalog::new(&profile);
        let resources = catalog.resources_of("resource.k8s.io", "v1alpha3");
        let (paths, schemas) = handmade_parts(&resources, "resource.k8s.io", "v1alpha3");
        let patch =
            &paths["/apis/resource.k8s.io/v1alpha3/namespaces/{namespace}/resourceclaims/{name}"]["patch"];
        assert_eq!(
            patch["x-kubernetes-group-version-kind"],
            json!({"group": "resource.k8s.io", "version": "v1alpha3", "kind": "ResourceClaim"})
        );
        assert!(
            patch["parameters"]
                .as_array()
                .unwrap()
                .iter()
                .any(|p| p["name"] == "fieldValidation" && p["in"] == "query")
        );
        let schema = &schemas["io.k8s.api.resource.v1alpha3.ResourceClaim"];
        assert_eq!(schema["x-kubernetes-group-version-kind"][0]["kind"], "ResourceClaim");
        assert!(schema["properties"]["status"].is_object());
        let status =
            &paths["/apis/resource.k8s.io/v1alpha3/namespaces/{namespace}/resourceclaims/{name}/status"];
        assert!(status["patch"].is_object());
    }

    #[test]
    fn accept_negotiation() {
        let with = |accept: &str| {
            let mut h = HeaderMap::new();
            h.insert(ACCEPT, HeaderValue::from_str(accept).unwrap());
            accepts_json(&h)
        };
        assert!(accepts_json(&HeaderMap::new()));
        for yes in [
            "application/json",
            "*/*",
            "application/*",
            "application/com.github.proto-openapi.spec.v2@v1.0+protobuf, application/json;q=0.5",
        ] {
            assert!(with(yes), "{yes}");
        }
        for no in [
            "application/com.github.proto-openapi.spec.v2@v1.0+protobuf",
            "text/html",
            "application/json;q=0",
        ] {
            assert!(!with(no), "{no}");
        }
    }
}
