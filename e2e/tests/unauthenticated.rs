//! Every document a client reads to learn the API (aggregated and legacy discovery, the OpenAPI
//! v3 index and each document it lists, OpenAPI v2 as JSON and protobuf), asked for through
//! Envoy anonymously and with a bearer token nobody issued, gets an apiserver's 403 or 401,
//! never the document: whatever the edge composes, it shows only to whom an apiserver would.
//! On the era stand-ins (1.33, 1.33, 1.36) and on those serving a real kube-apiserver's
//! captured documents (1.33-real, 1.33-real, 1.36-real).
//!
//! Needs `make wasm` and `make setup` (Envoy in .venv): fails, never skips.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Result;
use serde_json::{Value, json};
use skewgate_harness::clients::{self, Loop};
use skewgate_harness::cluster::{Cluster, Credentials};
use skewgate_harness::echo::SERVED_BY;

const ERA: &[(&str, &str)] = &[("a", "1.33"), ("b", "1.33"), ("c", "1.36")];
const REAL: &[(&str, &str)] = &[("a", "1.33-real"), ("b", "1.33-real"), ("c", "1.36-real")];
/// What kubectl and client-go ask `/api` and `/apis` for first (aggregated, protobuf or JSON).
const AGGREGATED: &str = "application/vnd.kubernetes.protobuf;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,\
                          application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json";
const NOPEER: &str =
    "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList;profile=nopeer,application/json";
/// What kubectl asks `/openapi/v2` for first.
const V2_PROTOBUF: &str = "application/com.github.proto-openapi.spec.v2@v1.0+protobuf";
const TIMEOUT: Duration = Duration::from_secs(10);

/// Every document a client reads to learn the API, with the Accept it asks for it with: the
/// union of what the apiservers serve (straight from each, so that a group/version only one of
/// them serves is asked for too) and of what the edge's own OpenAPI index lists.
async fn documents(c: &Cluster) -> Result<Vec<(String, &'static str)>> {
    let direct = c.direct_client(TIMEOUT)?;
    let mut paths: BTreeSet<(String, &'static str)> = BTreeSet::new();
    for path in ["/api", "/apis"] {
        paths.insert((path.to_string(), AGGREGATED));
        paths.insert((path.to_string(), NOPEER));
        paths.insert((path.to_string(), "application/json"));
    }
    paths.insert(("/openapi/v3".to_string(), "application/json"));
    paths.insert(("/openapi/v2".to_string(), "application/json"));
    paths.insert(("/openapi/v2".to_string(), V2_PROTOBUF));
    let mut openapi_indexes = Vec::new();
    for (id, _) in c.running() {
        let url = c.apiserver_url(&id)?;
        let core: Value = direct.get(format!("{url}/api")).send().await?.json().await?;
        for v in core["versions"].as_array().into_iter().flatten().filter_map(Value::as_str) {
            paths.insert((format!("/api/{v}"), "application/json"));
        }
        let groups: Value = direct.get(format!("{url}/apis")).send().await?.json().await?;
        for group in groups["groups"].as_array().into_iter().flatten() {
            let g = group["name"].as_str().unwrap_or_default();
            paths.insert((format!("/apis/{g}"), "application/json"));
            for gv in group["versions"].as_array().into_iter().flatten() {
                let gv = gv["groupVersion"].as_str().unwrap_or_default();
                paths.insert((format!("/apis/{gv}"), "application/json"));
            }
        }
        openapi_indexes.push(direct.get(format!("{url}/openapi/v3")).send().await?.json::<Value>().await?);
    }
    let admin = c.client(Credentials::AdminToken, TIMEOUT)?;
    openapi_indexes.push(admin.get(format!("{}/openapi/v3", c.envoy_url()?)).send().await?.json().await?);
    for index in openapi_indexes {
        for entry in index["paths"].as_object().into_iter().flatten().map(|(_, e)| e) {
            if let Some(relative) = entry["serverRelativeURL"].as_str() {
                paths.insert((relative.to_string(), "application/json"));
            }
        }
    }
    Ok(paths.into_iter().collect())
}

/// A client for Envoy with no credential, or with `Authorization: Bearer <token>`.
fn stranger(c: &Cluster, token: Option<&str>) -> Result<reqwest::Client> {
    let ca = reqwest::Certificate::from_pem(&std::fs::read(&c.pki.cluster_ca.cert_path)?)?;
    let mut headers = reqwest::header::HeaderMap::new();
    if let Some(token) = token {
        headers.insert(reqwest::header::AUTHORIZATION, format!("Bearer {token}").parse()?);
    }
    Ok(reqwest::Client::builder()
        .use_rustls_tls()
        .tls_built_in_root_certs(false)
        .add_root_certificate(ca)
        .no_proxy()
        .timeout(TIMEOUT)
        .default_headers(headers)
        .build()?)
}

async fn documents_need_authentication(name: &str, apiservers: &[(&str, &str)]) -> Result<()> {
    let c = clients::start_edge(Path::new(env!("CARGO_TARGET_TMPDIR")), "unauthenticated", name, apiservers)
        .await?;
    let documents = documents(&c).await?;
    let mut report = Loop::new(format!("unauthenticated {name}"));
    // Anonymous access is on (kube-apiserver's default): system:anonymous gets 403 for discovery
    // and OpenAPI (system:discovery is bound to system:authenticated only); a token nobody
    // issued gets 401 whatever anonymous access says.
    for (op, token, expected) in [("anonymous", None, 403), ("bearer-garbage", Some("garbage"), 401)] {
        let client = stranger(&c, token)?;
        for (i, (path, accept)) in documents.iter().enumerate() {
            let label = report.mark(&c, op, i).await?;
            let started = Instant::now();
            let r = client.get(format!("{}{path}", c.envoy_url()?)).header("accept", *accept).send().await?;
            let status = r.status().as_u16();
            let served_by = r.headers().get(SERVED_BY).and_then(|v| v.to_str().ok()).map(str::to_owned);
            let body = r.bytes().await?;
            let kind = serde_json::from_slice::<Value>(&body).ok().map(|v| v["kind"].clone());
            let wrong = status != expected || served_by.is_none() || kind != Some(json!("Status"));
            let failure = wrong.then(|| {
                format!(
                    "GET {path} (Accept: {accept}): {status}, expected {expected} from an apiserver; \
                     served by {served_by:?}, kind {kind:?}, {} bytes",
                    body.len()
                )
            });
            report.record(op, &label, started.elapsed(), failure);
        }
    }
    println!("unauthenticated {name}: {} documents, each anonymously and with a bad token", documents.len());
    let concluded = report.conclude(&c).await;
    if concluded.is_ok() {
        let out = c.out.clone();
        c.shutdown().await?;
        let _ = std::fs::remove_dir_all(out);
    }
    concluded
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn era_documents_need_authentication() -> Result<()> {
    documents_need_authentication("era", ERA).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_documents_need_authentication() -> Result<()> {
    documents_need_authentication("real", REAL).await
}
