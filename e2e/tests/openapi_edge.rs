//! OpenAPI composed at the edge, through a real Envoy with the filter and the
//! sidecar, on a 1.33-real/1.33-real/1.36-real stand-in cluster: the index lists every
//! group/version any apiserver serves, each document answers with kube-openapi's caching, v2
//! has every kind, and nobody gets a document an apiserver would have refused them.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use reqwest::StatusCode;
use reqwest::header::{ACCEPT, AUTHORIZATION, CACHE_CONTROL, ETAG, LOCATION};
use serde_json::Value;
use skewgate_harness::cluster::{self, Cluster, Credentials};
use skewgate_harness::kubectl::Kubectl;
use skewgate_harness::scenario::{claim_yaml, device_class_yaml};

const V2_PROTO: &str = "application/com.github.proto-openapi.spec.v2@v1.0+protobuf";

async fn start(name: &str) -> Result<Cluster> {
    let out = std::env::temp_dir().join(format!("sg-oa-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let options =
        cluster::Options::ephemeral(&out, &[("a", "1.33-real"), ("b", "1.33-real"), ("c", "1.36-real")]);
    cluster::start(&options).await
}

async fn get(
    client: &reqwest::Client,
    url: &str,
    headers: &[(&str, &str)],
) -> Result<(StatusCode, reqwest::header::HeaderMap, Vec<u8>)> {
    let mut request = client.get(url);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let resp = request.send().await.with_context(|| format!("GET {url}"))?;
    let (status, headers) = (resp.status(), resp.headers().clone());
    Ok((status, headers, resp.bytes().await?.to_vec()))
}

/// No credential, no redirects followed, trusting `ca`.
fn plain_client(ca: &std::path::Path) -> Result<reqwest::Client> {
    Ok(reqwest::Client::builder()
        .use_rustls_tls()
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(&std::fs::read(ca)?)?)
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .build()?)
}

fn index_keys(index: &Value) -> BTreeSet<String> {
    index["paths"].as_object().map(|p| p.keys().cloned().collect()).unwrap_or_default()
}

/// The composed index once the sidecar has composed (polled with a deadline).
async fn composed_index(c: &Cluster, admin: &reqwest::Client) -> Result<Value> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, _, body) = get(admin, &format!("{}/openapi/v3", c.envoy_url()?), &[]).await?;
        if status == StatusCode::OK {
            let index: Value = serde_json::from_slice(&body)?;
            if index_keys(&index).contains("apis/resource.k8s.io/v1") {
                return Ok(index);
            }
        }
        if Instant::now() > deadline {
            bail!("no composed index after 30 s: {status} {}", String::from_utf8_lossy(&body));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn composed_openapi_through_envoy() -> Result<()> {
    let mut c = start("composed").await?;
    let timeout = Duration::from_secs(20);
    let admin = c.client(Credentials::AdminToken, timeout)?;
    let direct = c.direct_client(timeout)?;
    let envoy = c.envoy_url()?;
    let index = composed_index(&c, &admin).await?;

    // The index lists every document any apiserver lists.
    let mut every = BTreeSet::new();
    let mut v2_definitions = BTreeSet::new();
    for id in ["a", "b", "c"] {
        let url = c.apiserver_url(id)?;
        let (_, _, own) = get(&direct, &format!("{url}/openapi/v3"), &[]).await?;
        every.extend(index_keys(&serde_json::from_slice(&own)?));
        let (_, _, v2) =
            get(&direct, &format!("{url}/openapi/v2"), &[("Accept", "application/json")]).await?;
        let v2: Value = serde_json::from_slice(&v2)?;
        v2_definitions.extend(v2["definitions"].as_object().context("v2 definitions")?.keys().cloned());
    }
    assert_eq!(index_keys(&index), every);

    // resource.k8s.io/v1, only on c: its document with the nested schema, immutable by hash.
    let url = index["paths"]["apis/resource.k8s.io/v1"]["serverRelativeURL"].as_str().context("url")?;
    let hash = url.split_once("?hash=").map(|(_, h)| h.to_string()).context("hash")?;
    let (status, headers, body) = get(&admin, &format!("{envoy}{url}"), &[]).await?;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers[CACHE_CONTROL], "public, immutable");
    assert_eq!(headers[ETAG], format!("\"{hash}\""));
    let doc: Value = serde_json::from_slice(&body)?;
    let exact = &doc["components"]["schemas"]["io.k8s.api.resource.v1.ExactDeviceRequest"];
    assert!(exact["properties"]["deviceClassName"].is_object(), "{exact}");
    let (status, _, body) =
        get(&admin, &format!("{envoy}{url}"), &[("If-None-Match", &format!("\"{hash}\""))]).await?;
    assert_eq!((status, body.len()), (StatusCode::NOT_MODIFIED, 0));
    // c authorized both: asked without the hash, for one byte.
    let asked: Vec<(String, u16)> = c
        .standin("c")?
        .recent()
        .into_iter()
        // The sidecar's own fetches carry the hash.
        .filter(|s| {
            s.target.starts_with("/openapi/v3/apis/resource.k8s.io/v1") && !s.target.contains("hash=")
        })
        .map(|s| (s.target, s.status))
        .collect();
    assert!(
        asked.iter().all(|a| *a == ("/openapi/v3/apis/resource.k8s.io/v1".to_string(), 206)),
        "{asked:?}"
    );
    assert_eq!(asked.len(), 2);
    let stale = "/openapi/v3/apis/resource.k8s.io/v1?hash=0123";
    let bearer = format!("Bearer {}", c.admin_token());
    let no_redirects = plain_client(&c.pki.cluster_ca.cert_path)?;
    let (status, headers, _) =
        get(&no_redirects, &format!("{envoy}{stale}"), &[("Authorization", &bearer)]).await?;
    assert_eq!(
        (status, headers.get(LOCATION).and_then(|l| l.to_str().ok())),
        (StatusCode::MOVED_PERMANENTLY, Some(url))
    );

    // A group/version all three serve, with differing documents: the composed one has every
    // path and schema any of them has.
    for key in ["apis/storage.k8s.io/v1", "api/v1", "apis/admissionregistration.k8s.io/v1"] {
        let url = index["paths"][key]["serverRelativeURL"].as_str().context("url")?;
        let (status, _, body) = get(&admin, &format!("{envoy}{url}"), &[]).await?;
        assert_eq!(status, StatusCode::OK, "{key}");
        let composed: Value = serde_json::from_slice(&body)?;
        for id in ["a", "c"] {
            let (_, _, own) =
                get(&direct, &format!("{}/openapi/v3/{key}", c.apiserver_url(id)?), &[]).await?;
            let own: Value = serde_json::from_slice(&own)?;
            for map in ["paths", "components"] {
                let names = |v: &Value| -> BTreeSet<String> {
                    let m = if map == "paths" { &v["paths"] } else { &v["components"]["schemas"] };
                    m.as_object().map(|o| o.keys().cloned().collect()).unwrap_or_default()
                };
                let missing: Vec<String> = names(&own).difference(&names(&composed)).cloned().collect();
                assert!(missing.is_empty(), "{key} lacks {id}'s {map} {missing:?}");
            }
        }
    }

    // v2 (JSON) has every kind any apiserver serves; its ETag answers 304.
    let (status, headers, body) =
        get(&admin, &format!("{envoy}/openapi/v2"), &[("Accept", "application/json")]).await?;
    assert_eq!(status, StatusCode::OK);
    let v2: Value = serde_json::from_slice(&body)?;
    let have: BTreeSet<String> =
        v2["definitions"].as_object().context("definitions")?.keys().cloned().collect();
    let missing: Vec<&String> = v2_definitions.difference(&have).collect();
    assert!(missing.is_empty(), "v2 lacks {missing:?}");
    let etag = headers[ETAG].to_str()?.to_string();
    assert_eq!(
        get(&admin, &format!("{envoy}/openapi/v2"), &[("If-None-Match", &etag)]).await?.0,
        StatusCode::NOT_MODIFIED
    );
    // v2 in protobuf (what kubectl asks for first): merged at the wire level, every definition
    // and path of every apiserver's, decoded by name.
    let mut proto_names = BTreeSet::new();
    for id in ["a", "b", "c"] {
        let url = c.apiserver_url(id)?;
        let (_, _, own) = get(&direct, &format!("{url}/openapi/v2"), &[("Accept", V2_PROTO)]).await?;
        proto_names.extend(skewgate_openapi::v2proto::names(&own).map_err(anyhow::Error::msg)?);
    }
    let (status, headers, body) =
        get(&admin, &format!("{envoy}/openapi/v2"), &[("Accept", V2_PROTO)]).await?;
    assert_eq!((status, headers["content-type"].to_str()?), (StatusCode::OK, V2_PROTO));
    let have = skewgate_openapi::v2proto::names(&body).map_err(anyhow::Error::msg)?;
    let missing: Vec<&String> = proto_names.difference(&have).collect();
    assert!(missing.is_empty(), "v2 protobuf lacks {missing:?}");
    assert!(have.contains("definitions/io.k8s.api.resource.v1.ResourceClaim"));
    assert!(have.contains("definitions/io.k8s.api.resource.v1beta2.ResourceClaim"));
    let etag = headers[ETAG].to_str()?.to_string();
    let conditional = [("Accept", V2_PROTO), ("If-None-Match", etag.as_str())];
    assert_eq!(get(&admin, &format!("{envoy}/openapi/v2"), &conditional).await?.0, StatusCode::NOT_MODIFIED);

    // No credential, or a bad one: the apiserver's 401/403 for every path, never a document.
    let anonymous = plain_client(&c.pki.cluster_ca.cert_path)?;
    let paths = ["/openapi/v2", "/openapi/v3", url, "/openapi/v3/api/v1", stale];
    for path in paths {
        for (who, client, headers) in [
            ("anonymous", &anonymous, vec![]),
            ("bad token", &anonymous, vec![(AUTHORIZATION.as_str(), "Bearer garbage")]),
        ] {
            let (status, _, body) = get(client, &format!("{envoy}{path}"), &headers).await?;
            let direct_anonymous = plain_client(&c.pki.peer_ca.cert_path)?;
            let (own, _, _) =
                get(&direct_anonymous, &format!("{}{path}", c.apiserver_url("c")?), &headers).await?;
            assert!(matches!(status.as_u16(), 401 | 403), "{who} {path}: {status}");
            assert_eq!(status, own, "{who} {path}");
            let text = String::from_utf8_lossy(&body);
            assert!(text.contains("\"kind\":\"Status\""), "{who} {path}: {text}");
        }
    }

    // kubectl explain of a nested field of a kind only the 1.36 apiserver serves.
    let cache = c.out.join("kube-cache");
    let kubectl = Kubectl::new(&c.kubeconfig, &cache)?;
    for round in 0..3 {
        let explained = kubectl
            .with_cache(&c.out.join(format!("kube-cache-{round}")))
            .ok(&[
                "explain",
                "resourceclaims.spec.devices.requests.exactly",
                "--api-version=resource.k8s.io/v1",
            ])
            .await?;
        assert!(explained.contains("FIELD: exactly <ExactDeviceRequest>"), "{explained}");
        assert!(explained.contains("deviceClassName"), "{explained}");
    }

    // `skewgate explain` names the composer and the apiservers whose documents went in.
    let ecds = std::fs::read(c.envoy_dir().join("ecds/ecds.json"))?;
    let table = skewgate::explain::load_table(&ecds).map_err(anyhow::Error::msg)?;
    let summary: Value = serde_json::from_slice(&std::fs::read(c.envoy_dir().join("openapi.json"))?)?;
    for (path, inputs, from) in
        [(url, vec!["c"], "c (unchanged)"), ("/openapi/v2", vec!["c", "a", "b"], "merged")]
    {
        let req = skewgate::explain::Request {
            method: "GET".into(),
            target: path.into(),
            openapi_summary: Some(summary.clone()),
            ..Default::default()
        };
        let shown = skewgate::explain::explain(&table, &req);
        assert_eq!(shown["openapi"]["composedBy"]["cluster"], "skewgate-openapi", "{shown}");
        assert_eq!(shown["openapi"]["document"]["inputs"], serde_json::json!(inputs), "{shown}");
        assert_eq!(shown["openapi"]["document"]["from"], from, "{shown}");
    }

    // The composer polls conditionally: an unchanged v2 costs a 304, not megabytes.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !c.standin("a")?.recent().iter().any(|s| s.target == "/openapi/v2" && s.status == 304) {
        if Instant::now() > deadline {
            bail!("the composer never asked for /openapi/v2 conditionally");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let metrics = c.sidecar_metrics().await?;
    for line in ["skewgate_openapi_documents 53", "skewgate_openapi_compositions_total 1"] {
        assert!(metrics.lines().any(|l| l == line), "{line} not in {metrics}");
    }

    // The composer gone: a clear 503, never a document from one apiserver.
    c.stop_sidecar().await?;
    let socket = c.envoy_dir().join("openapi.sock");
    let deadline = Instant::now() + Duration::from_secs(10);
    while socket.exists() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for path in ["/openapi/v3", url, "/openapi/v2"] {
        let (status, _, body) =
            get(&admin, &format!("{envoy}{path}"), &[(ACCEPT.as_str(), "application/json")]).await?;
        let text = String::from_utf8_lossy(&body);
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{path}: {text}");
        assert!(text.contains("composed OpenAPI document is unavailable"), "{path}: {text}");
    }
    c.shutdown().await
}

const CONFIGMAP: &str = "apiVersion: v1
kind: ConfigMap
metadata:
  name: edge-config
  namespace: default
data:
  a: b
";

/// A ConfigMap, a DeviceClass of the 1.33 era and a claim of the 1.36 era in one file.
fn manifest_yaml() -> String {
    let class = device_class_yaml("resource.k8s.io/v1alpha3", "gpu-edge");
    format!("{CONFIGMAP}---\n{class}---\n{}", claim_yaml("claim-edge", "default", "gpu-edge"))
}

/// kubectl with its default (client-side, OpenAPI-backed) validation through the edge on the
/// 1.33/1.33/1.36 era cluster, a fresh cache each run: every run passes (a third to two thirds
/// of them failed while OpenAPI requests went to one apiserver, not a composed document).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_validates_against_composed_openapi() -> Result<()> {
    let out = std::env::temp_dir().join(format!("sg-oa-era-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let options = cluster::Options::ephemeral(&out, &[("a", "1.33"), ("b", "1.33"), ("c", "1.36")]);
    let c = cluster::start(&options).await?;
    let admin = c.client(Credentials::AdminToken, Duration::from_secs(20))?;
    composed_index(&c, &admin).await?;
    let manifest = c.out.join("manifest.yaml");
    std::fs::write(&manifest, manifest_yaml())?;
    let file = manifest.to_str().context("path")?;
    let kubectl = Kubectl::new(&c.kubeconfig, &c.out.join("cache"))?.with_context("skewgate-admin");
    let runs = 5;
    let mut failures = Vec::new();
    for run in 0..runs {
        let k = kubectl.with_cache(&c.out.join(format!("cache-{run}")));
        for args in [
            vec!["apply", "-f", file],
            vec!["apply", "--server-side", "-f", file],
            vec!["create", "--dry-run=server", "-f", file],
            // The era stand-ins' v1alpha3 documents are hand-made, without nested fields.
            vec!["explain", "deviceclasses.spec", "--api-version=resource.k8s.io/v1alpha3"],
            vec![
                "explain",
                "resourceclaims.spec.devices.requests.exactly",
                "--api-version=resource.k8s.io/v1",
            ],
        ] {
            let out = k.run(&args).await?;
            // `create` of objects that exist fails with AlreadyExists after validation passed.
            let ok = out.ok || (args[0] == "create" && out.stderr.contains("AlreadyExists"));
            if !ok {
                failures.push(format!("{}: {}", args.join(" "), out.stderr.trim()));
            }
        }
        let diff = k.run(&["diff", "-f", file]).await?;
        if !diff.ok && !diff.stderr.is_empty() {
            failures.push(format!("diff: {}", diff.stderr.trim()));
        }
    }
    assert!(failures.is_empty(), "{} failures in {} runs: {failures:#?}", failures.len(), runs * 6);
    c.shutdown().await
}
