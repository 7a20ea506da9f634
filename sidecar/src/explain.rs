//! `skewgate explain`: what the filter does with one request, and why. It runs the very code the
//! filter runs (`core::decision`), on a table file, after the path normalisation Envoy applies
//! before the filter sees the request ([`skewgate_envoy::path`]).

use serde_json::{Map, Value, json};
use skewgate_core::accept::Encoding;
use skewgate_core::decision::{self, Action, Composed, Form, GatedWrite, Reason, RequestHead};
use skewgate_core::discovery::protobuf;
use skewgate_core::edits::{self, Carrier, Edit};
use skewgate_core::features;
use skewgate_core::identity;
use skewgate_core::pretty;
use skewgate_core::request_info::{RequestInfo, decode_path, split_target};
use skewgate_core::status;
use skewgate_core::table::RoutingTable;

use skewgate_envoy::path as envoy_path;
use skewgate_envoy::table_from_ecds;

/// A request as the filter would see it.
#[derive(Debug, Clone, Default)]
pub struct Request {
    pub method: String,
    pub target: String,
    /// Downstream headers, names as given.
    pub headers: Vec<(String, String)>,
    pub client_cert_subject: Option<String>,
    /// That certificate's PEM, whose names are then checked as kube-apiserver reads them;
    /// without it they are taken as checked.
    pub client_cert: Option<String>,
    /// The OpenAPI composer's summary (`openapi.json` in Envoy's directory), if given.
    pub openapi_summary: Option<Value>,
}

impl Request {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
}

/// Reads a routing table, or an `ecds.json` that carries one.
pub fn load_table(bytes: &[u8]) -> Result<RoutingTable, String> {
    let value: Value = serde_json::from_slice(bytes).map_err(|e| format!("not JSON: {e}"))?;
    if value.get("resources").is_some() {
        let inner = table_from_ecds(&value)
            .ok_or("an ecds.json without a filter configuration at resources[0].typed_config.config.configuration.value")?;
        return RoutingTable::from_json(inner.as_bytes()).map_err(|e| e.to_string());
    }
    RoutingTable::from_json(bytes).map_err(|e| e.to_string())
}

/// The decision for `req` as a client sends it: Envoy normalises the path first (or answers
/// itself), then the filter decides on what Envoy forwards.
pub fn explain(table: &RoutingTable, req: &Request) -> Value {
    let forwarded = match envoy_path::normalize(&req.target) {
        Ok(forwarded) => forwarded,
        Err(refusal) => {
            return json!({
                "path": {"received": req.target},
                "action": "respond",
                "status": refusal.status,
                "by": "envoy",
                "envoyDetails": refusal.details,
                "reason": format!("Envoy refuses it before the filter runs: {}", refusal.why),
            });
        }
    };
    let mut out = decide(table, req, &forwarded);
    if let Value::Object(map) = &mut out {
        map.insert("path".into(), json!({"received": req.target, "forwarded": forwarded}));
    }
    out
}

/// What the filter does with a request whose (normalised) target is `target`.
fn decide(table: &RoutingTable, req: &Request, target: &str) -> Value {
    let head = RequestHead {
        method: &req.method,
        target,
        accept: req.header("accept"),
        if_none_match: req.header("if-none-match"),
        client_subject: req.client_cert_subject.as_deref(),
        client_certificate: req.client_cert.as_deref().map(str::as_bytes),
        certificate_checked: req.client_cert.is_none(),
        token: req
            .headers
            .iter()
            .any(|(n, v)| identity::carries_token(&n.to_ascii_lowercase(), v.as_bytes())),
        pretty_agent: req.header("user-agent").is_some_and(|ua| pretty::agent_wants(ua.as_bytes())),
    };
    let (raw_path, query) = split_target(target);
    let decoded = decode_path(raw_path);
    let (info, decision) = match &decoded {
        Ok(path) => {
            let info = RequestInfo::parse(&req.method, path, query);
            let decision = decision::decide_parsed(table, &head, &info);
            (serde_json::to_value(&info).unwrap_or(Value::Null), decision)
        }
        Err(e) => (json!({"error": e.to_string()}), decision::decide(table, &head)),
    };

    let mut out = Map::new();
    out.insert("requestInfo".into(), info);
    match &decision.action {
        Action::Route(route) => {
            let serving: Vec<&str> = match (decision.serving, decision.reason) {
                (Some(s), _) => table.members(s).collect(),
                (None, Reason::ServedByNone) => Vec::new(),
                (None, _) => table.apiservers().iter().map(|a| a.id.as_str()).collect(),
            };
            out.insert("action".into(), json!("route"));
            out.insert("cluster".into(), json!(route.cluster));
            out.insert("rerouted".into(), json!(route.rerouted));
            out.insert("longRunning".into(), json!(route.long_running));
            out.insert("servingSet".into(), json!(serving));
            out.insert("anonymous".into(), json!(decision.anonymous));
            let credential_id = decision.identity.is_some() && table.policy().x509_credential_id;
            out.insert("requestHeaders".into(), header_edits(req, &decision, Carrier::Filter, credential_id));
            // With the native module ahead of the filter (docs/native-module.md): what it does
            // instead, for the requests it routes itself.
            if skewgate_core::native::module_handles(table, &decision) {
                out.insert(
                    "withNativeModule".into(),
                    json!({"requestHeaders": header_edits(req, &decision, Carrier::Module, credential_id)}),
                );
            }
            if let Some(gated) = route.gated {
                out.insert("gatedFields".into(), gated_fields(table, &gated));
            }
            if let Some(composer) = decision.openapi {
                out.insert("openapi".into(), openapi(req, target, composer));
            }
            if let Some(reply) = route.compose {
                let headers: Map<String, Value> = reply
                    .headers()
                    .iter()
                    .filter(|(_, v)| !v.is_empty())
                    .map(|(k, v)| ((*k).into(), json!(v)))
                    .collect();
                let (document, inputs) = composed_from(table, reply.source);
                out.insert(
                    "composed".into(),
                    json!({
                        "when": "the apiserver answers 2xx or 304; its 401/403 reach the client unchanged",
                        "status": reply.status,
                        "document": document,
                        "inputs": inputs,
                        "responseHeaders": headers,
                        "body": body_summary(reply.body),
                    }),
                );
            }
        }
        Action::Refuse(why) => {
            out.insert("action".into(), json!("respond"));
            out.insert("status".into(), json!(401));
            out.insert("body".into(), json!(status::unauthorized(&why.reason()).message));
        }
    }
    out.insert("reason".into(), json!(decision.reason.as_str()));
    Value::Object(out)
}

/// A write whose body decides where it goes: the fields read for, and where a body that sets
/// them goes.
fn gated_fields(table: &RoutingTable, gated: &GatedWrite) -> Value {
    let fields: Vec<Value> = gated
        .resource
        .fields
        .iter()
        .filter(|f| features::bit(f.gate) & gated.gates != 0)
        .map(|f| {
            let path: Vec<&str> = f.path.iter().map(|s| s.json).collect();
            let to = gated.route(table, features::bit(f.gate)).map(|(s, r)| (r.cluster, table.members(s).collect::<Vec<_>>()));
            json!({"field": path.join("."), "gate": f.gate, "ifSet": to.map(|(cluster, members)| json!({"cluster": cluster, "servingSet": members}))})
        })
        .collect();
    json!({
        "when": "the body is read whole first (JSON, protobuf, patches; over 256 KiB or compressed it is not read and goes where every field is kept)",
        "fields": fields,
    })
}

/// An OpenAPI document composed at the edge: what the apiserver is asked (to authorize), what
/// the composer is asked, and, with its summary, which apiservers' documents went in.
fn openapi(req: &Request, target: &str, composer: &str) -> Value {
    let composed = req
        .openapi_summary
        .as_ref()
        .and_then(|s| crate::openapi::Composed::summary_entry(s, target))
        .cloned()
        .unwrap_or_else(|| json!("(no summary given: --openapi ENVOY_DIR/openapi.json)"));
    json!({
        "authorizedBy": {
            "request": {
                ":path": skewgate_core::openapi::authorize_target(target),
                "accept": skewgate_core::openapi::AUTHORIZE_ACCEPT,
                "range": skewgate_core::openapi::AUTHORIZE_RANGE,
                "removed": ["if-none-match", "if-modified-since", "if-range"],
            },
            "then": "2xx, 304, 404 or 416: the composed answer below; 401, 403 and anything else reach the client as the apiserver sent them",
        },
        "composedBy": {
            "cluster": composer,
            "request": {":path": target, "accept": req.header("accept"), "if-none-match": req.header("if-none-match")},
            "unreachable": "503 Status, never one apiserver's document",
        },
        "document": composed,
    })
}

/// What the filter (or the native module) removes and sets on the way upstream: core's edits,
/// as the adapters carry them out.
fn header_edits(
    req: &Request,
    d: &decision::Decision<'_, '_>,
    carrier: Carrier,
    credential_id: bool,
) -> Value {
    let placeholder = credential_id.then_some("X509SHA256=<SHA-256 of the client certificate>");
    let names = req.headers.iter().map(|(n, _)| n.as_str());
    let (mut removed, mut set) = (Vec::new(), Vec::new());
    for edit in edits::request_edits(d, names, carrier, placeholder) {
        match edit {
            Edit::Remove(name) => removed.push(json!(name)),
            Edit::Set(name, value) | Edit::Add(name, value) => set.push(json!([name, value])),
        }
    }
    json!({"remove": removed, "set": set})
}

/// Which document the edge answers with, and the apiservers whose documents it merges.
fn composed_from(table: &RoutingTable, source: Composed) -> (String, Vec<String>) {
    let everyone = || table.apiservers().iter().map(|a| a.id.clone()).collect();
    match source {
        Composed::MergedDiscovery(form) => {
            (format!("peer-aggregated /apis (apidiscovery.k8s.io/v2), {}", form_name(form)), everyone())
        }
        Composed::Legacy(index, form) => match table.legacy_discovery().at(index) {
            Some(d) => {
                (format!("composed legacy discovery {}, {}", d.path, form_name(form)), d.inputs.clone())
            }
            None => ("(missing)".into(), Vec::new()),
        },
        Composed::NotAcceptable => (
            "406 Not Acceptable: composed discovery is served in JSON and protobuf, not YAML".into(),
            Vec::new(),
        ),
    }
}

fn form_name(form: Form) -> &'static str {
    match form.encoding {
        Encoding::Json if form.pretty => "JSON (indented, as for curl or ?pretty=true)",
        Encoding::Json => "JSON",
        Encoding::Yaml => "YAML",
        Encoding::Protobuf => "protobuf",
    }
}

fn body_summary(body: &[u8]) -> String {
    if body.is_empty() {
        return "(empty)".into();
    }
    if let Some((_, kind)) = protobuf::type_meta(body) {
        return format!("{kind} in protobuf, {} bytes", body.len());
    }
    let Ok(doc) = serde_json::from_slice::<Value>(body) else { return format!("{} bytes", body.len()) };
    let count = |key: &str| doc.get(key).and_then(Value::as_array).map_or(0, Vec::len);
    let size = body.len();
    match doc.get("kind").and_then(Value::as_str).unwrap_or_default() {
        "APIGroupDiscoveryList" => {
            format!("peer-aggregated APIGroupDiscoveryList, {} groups, {size} bytes", count("items"))
        }
        "APIGroupList" => format!("APIGroupList, {} groups, {size} bytes", count("groups")),
        "APIResourceList" => format!(
            "APIResourceList {}, {} entries, {size} bytes",
            doc["groupVersion"].as_str().unwrap_or_default(),
            count("resources")
        ),
        "APIGroup" => {
            let versions: Vec<&str> = doc["versions"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|v| v["version"].as_str())
                .collect();
            format!(
                "APIGroup {}, versions {versions:?}, preferred {}, {size} bytes",
                doc["name"].as_str().unwrap_or_default(),
                doc["preferredVersion"]["version"].as_str().unwrap_or_default()
            )
        }
        "APIVersions" => format!("APIVersions {}, {size} bytes", doc["versions"]),
        "Status" => format!("Status {}: {}", doc["code"], doc["message"].as_str().unwrap_or_default()),
        _ => format!("{size} bytes"),
    }
}
