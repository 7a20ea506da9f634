//! End-to-end on real binaries: `make e2e KUBE_APISERVER=PATH ETCD=PATH`. Three real
//! kube-apiservers sharing one etcd — a and b emulating 1.33 with beta APIs on
//! (`drill::REAL_OLD`), c at the binary's own version — behind a real Envoy 1.40 with the built
//! filter and the sidecar, driven by the pinned kubectl and a Rust load loop. The scenarios of
//! `e2e/` that real apiservers can answer (the others read the stand-ins' own records or need
//! a stand-in's rogue certificate). R15 upgrades all three from the release you upgrade from
//! (`make e2e … OLD_KUBE_APISERVER=PATH [OLD_KUBE_CONTROLLER_MANAGER=PATH]`; without it, the
//! binary emulating 1.33) to the binary, then the controller-manager.
//!
//! Real apiservers do not say who served a request: Envoy's access log (on through the runtime
//! key `skewgate.access_log_min_status`) does, by upstream address.
//!
//! Not run by `cargo test` (`test = false` in Cargo.toml: CI has no such binaries); without
//! `SKEWGATE_KUBE_APISERVER` and `SKEWGATE_ETCD` every scenario fails, never skips.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use serde_json::{Value, json};
use skewgate_harness::cluster::{self, Cluster, Credentials, Options};
use skewgate_harness::kubectl::Kubectl;
use skewgate_harness::load::Record;
use skewgate_harness::real::{REAL_NEW, REAL_OLD};
use skewgate_harness::scenario::{
    Row, cert_sha256, claim_yaml, class_patch, fresh_dir, ids, kubectl, listing, scenario, serving,
    successes_after, until, vm_untroubled, volume_claim,
};
use skewgate_harness::{clients, paths, real};

use crate::common::peer_loss::Outcomes;
use crate::common::shared_state::resource_version;
use crate::common::watch::{Watch, claim, same_events, write_claims};
use crate::common::{CLAIMS, CREDENTIAL_ID, Suite, TIMEOUT, V2};

mod common;

/// A rolling upgrade one third done: a and b at 1.33 (betas on), c upgraded.
const ERAS: [(&str, &str); 3] = [("a", REAL_OLD), ("b", REAL_OLD), ("c", REAL_NEW)];
/// Only the 1.33 apiservers (betas on) serve it.
const OLD_CLASSES: &str = "deviceclasses.v1beta1.resource.k8s.io";
const SUITE: Suite = Suite { old_classes: "v1beta1", new_profile: REAL_NEW, names_itself: false };

// ---------------------------------------------------------------------------------------------
// Scaffolding (the rest is in skewgate_harness::scenario, shared with e2e/ and e2e_peers.rs,
// and the scenario steps in common/, shared with e2e/)

/// A cluster of real apiservers under `target/tmp/e2e-real/<name>-<pid>`, Envoy's access log on.
async fn start(name: &str, tweak: impl FnOnce(&mut Options)) -> Result<Cluster> {
    let binaries = real::Binaries::from_env()?.with_context(|| {
        format!(
            "this suite runs real binaries: make e2e KUBE_APISERVER=PATH ETCD=PATH (or set {} and {})",
            real::KUBE_APISERVER_ENV,
            real::ETCD_ENV
        )
    })?;
    paths::envoy_binary()?;
    paths::kubectl_binary()?;
    paths::filter_wasm()?;
    let out = fresh_dir(Path::new(env!("CARGO_TARGET_TMPDIR")), "e2e-real", name);
    let mut options = Options::ephemeral(&out, &ERAS);
    options.real = Some(binaries);
    tweak(&mut options);
    let c = cluster::start(&options).await.with_context(|| format!("starting cluster {name}"))?;
    clients::access_log_on(&c).await?;
    Ok(c)
}

/// The filter's VM never failed; then the cluster stops and its files go (a failed scenario
/// keeps them, the apiservers' logs included).
async fn finish(c: Cluster, row: &mut Row) -> Result<()> {
    vm_untroubled(c.envoy()?).await?;
    let version = c.real.as_ref().and_then(|r| r.versions().into_values().next()).unwrap_or_default();
    row.figure(version);
    let out = c.out.clone();
    c.shutdown().await?;
    let _ = std::fs::remove_dir_all(out);
    Ok(())
}

/// One line of Envoy's access log (format in envoy-config/bootstrap.yaml).
#[derive(Debug, Clone)]
struct Access {
    path: String,
    status: u16,
    cluster: String,
    /// The apiserver Envoy sent it to, by upstream address.
    apiserver: Option<String>,
}

fn access_log(c: &Cluster) -> Result<Vec<Access>> {
    let mut out = Vec::new();
    for line in c.envoy()?.log().lines() {
        let Some((_, rest)) = line.split_once(" \"") else { continue };
        let Some((request, tail)) = rest.split_once("\" ") else { continue };
        if !tail.contains(" route=") {
            continue;
        }
        let path = request.split(' ').nth(1).unwrap_or_default().to_string();
        let status = tail.split(' ').next().and_then(|s| s.parse().ok()).unwrap_or(0);
        let field = |key: &str| tail.split(' ').find_map(|w| w.strip_prefix(key)).unwrap_or_default();
        let apiserver = field("upstream=")
            .rsplit_once(':')
            .and_then(|(_, port)| port.parse().ok())
            .and_then(|port| c.apiserver_at(port));
        out.push(Access { path, status, cluster: field("cluster=").to_string(), apiserver });
    }
    Ok(out)
}

/// Who served each request whose path contains `marker`, once all `n` are in the log.
async fn served_by(c: &Cluster, marker: &str, n: usize) -> Result<BTreeMap<String, usize>> {
    let lines = until(&format!("{n} access log lines with {marker}"), Duration::from_secs(10), || {
        let lines: Vec<Access> = access_log(c)?.into_iter().filter(|a| a.path.contains(marker)).collect();
        Ok((lines.len() >= n).then_some(lines))
    })
    .await?;
    let mut by = BTreeMap::new();
    for a in lines {
        *by.entry(a.apiserver.unwrap_or_else(|| format!("Envoy ({} {})", a.status, a.cluster)))
            .or_default() += 1;
    }
    Ok(by)
}

/// Envoy's health checks (1 s apart, two failed connections) take this long at most to see a
/// killed apiserver down.
const KILL_WINDOW: Duration = Duration::from_secs(2);

/// A request Envoy sent to an apiserver over a connection that died under it when the process
/// was killed (SIGKILL at `killed`): a 503 `Status` naming the reset, sent before Envoy's health
/// checks could know. Envoy retries only failures before the request was sent.
fn raced_the_kill(r: &Record, killed: Duration) -> bool {
    r.is_unavailable_status()
        && r.ended() >= killed
        && r.started <= killed + KILL_WINDOW
        && r.message.as_deref().is_some_and(|m| m.contains("upstream_reset_before_response_started"))
}

// ---------------------------------------------------------------------------------------------
// 1. Rerouting

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r01_rerouting() -> Result<()> {
    scenario("R1", "rerouting (real)", rerouting()).await
}

async fn rerouting() -> Result<Row> {
    let mut row = Row::default();
    let c = start("r01", |_| {}).await?;
    let table = c.table_on_disk()?;
    SUITE.ten_by_servers(&table)?;
    assert_eq!(serving(&table, CLAIMS), ids(&["c"]));
    assert_eq!(serving(&table, OLD_CLASSES), ids(&["a", "b"]));
    let alice = c.client(Credentials::Alice, TIMEOUT)?;
    let base = c.envoy_url()?;
    for (name, path, runs, expected) in [
        (CLAIMS, "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims", 300, ids(&["c"])),
        (OLD_CLASSES, "/apis/resource.k8s.io/v1beta1/deviceclasses", 300, ids(&["a", "b"])),
        ("configmaps.v1", "/api/v1/namespaces/default/configmaps", 300, ids(&["a", "b", "c"])),
    ] {
        let marker = format!("e2e-mark={}", name.replace('.', "-"));
        let started = Instant::now();
        let mut statuses: BTreeMap<u16, usize> = BTreeMap::new();
        for i in 0..runs {
            let r = alice.get(format!("{base}{path}?{marker}-{i}&limit=10")).send().await?;
            *statuses.entry(r.status().as_u16()).or_default() += 1;
        }
        let took = started.elapsed();
        row.requests += runs;
        let by = served_by(&c, &marker, runs).await?;
        println!("{name} ×{runs} in {took:.1?}: statuses {statuses:?}, served by {by:?}");
        ensure!(statuses == BTreeMap::from([(200, runs)]), "{name}: {statuses:?}");
        ensure!(by.keys().cloned().collect::<Vec<_>>() == expected, "{name}: served by {by:?}");
        row.figure(format!("{name} ×{runs} → {by:?}"));
    }
    // kubectl, discovery through Envoy, each GVR found and listed.
    let k = kubectl(&c)?;
    for gvr in [CLAIMS, OLD_CLASSES, "pods"] {
        k.ok(&["get", gvr, "-A"]).await?;
        row.requests += 1;
    }
    let e = k.fails(&["get", "--raw", "/apis/resource.k8s.io/v1alpha9/deviceclasses"]).await?;
    row.requests += 1;
    ensure!(e.contains("NotFound") || e.contains("not found"), "a GVR nobody serves: {e}");
    finish(c, &mut row).await?;
    Ok(row)
}

// ---------------------------------------------------------------------------------------------
// 2. Discovery

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r02_discovery() -> Result<()> {
    scenario("R2", "discovery (real)", discovery()).await
}

async fn discovery() -> Result<Row> {
    let mut row = Row::default();
    let c = start("r02", |_| {}).await?;
    let era_only = ["resource.k8s.io/v1", "resource.k8s.io/v1beta1", "networking.k8s.io/v1beta1"];
    SUITE.discovery(&c, &mut row, &era_only).await?;
    // Legacy discovery of a group/version every apiserver serves, with a resource only c lists
    // (VolumeAttributesClass is v1 since 1.34): the composed document, never one 1.33 server's.
    // It needs every apiserver's legacy walk, and the 1.33 ones answer 404 under a
    // group/version their own legacy `/apis` lists (resource.k8s.io/v1).
    let k = kubectl(&c)?;
    let runs = 12;
    for _ in 0..runs {
        let list: Value = serde_json::from_str(&k.ok(&["get", "--raw", "/apis/storage.k8s.io/v1"]).await?)?;
        row.requests += 1;
        let names: Vec<&str> =
            list["resources"].as_array().into_iter().flatten().filter_map(|r| r["name"].as_str()).collect();
        ensure!(names.contains(&"volumeattributesclasses"), "legacy /apis/storage.k8s.io/v1: {names:?}");
    }
    row.figure(format!("legacy /apis/storage.k8s.io/v1 ×{runs}: the union each time"));
    finish(c, &mut row).await?;
    Ok(row)
}

/// `skewgate plan` on documents `skewgate-harness discovery` saved from the binary itself, with
/// and without `--runtime-config=api/beta=true`: turning the betas on adds exactly what the beta
/// run serves beyond the plain one and keeps everything served (exit 0); turning them off goes
/// the other way and is refused (exit 1), each removed beta naming the version its objects stay
/// readable as where there is one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r14_plan_from_a_binary() -> Result<()> {
    scenario("R14", "skewgate plan from a binary's own discovery (real)", plan_from_a_binary()).await
}

async fn plan_from_a_binary() -> Result<Row> {
    let mut row = Row::default();
    let binaries = real::Binaries::from_env()?.context("make e2e KUBE_APISERVER=PATH ETCD=PATH")?;
    let kube_apiserver = binaries.kube_apiserver.clone().context("no kube-apiserver binary")?;
    let out = fresh_dir(Path::new(env!("CARGO_TARGET_TMPDIR")), "e2e-real", "r14");
    let harness = paths::harness_binary()?;
    for (dir, flags) in
        [("plain", vec![]), ("betas", vec!["--apiserver-flag=--runtime-config=api/beta=true"])]
    {
        let started = Instant::now();
        let o = std::process::Command::new(&harness)
            .args(["discovery", "--kube-apiserver"])
            .arg(&kube_apiserver)
            .arg("--etcd")
            .arg(&binaries.etcd)
            .arg("--out")
            .arg(out.join(dir))
            .args(&flags)
            .output()?;
        ensure!(o.status.success(), "harness discovery: {}", String::from_utf8_lossy(&o.stderr));
        row.requests += 2;
        row.figure(format!("{dir} documents in {:.1} s", started.elapsed().as_secs_f64()));
    }
    let docs = |dir: &str| format!("{0}/apis.json,{0}/api.json", out.join(dir).display());
    let plan = |from: &str, to: &str| -> Result<(Option<i32>, Value)> {
        let o = std::process::Command::new(paths::skewgate_binary()?)
            .args([
                "plan",
                "--discovery",
                &format!("a={}", docs(from)),
                "--discovery",
                &format!("b={}", docs(from)),
            ])
            .args(["--to", &docs(to), "--format", "json"])
            .output()?;
        let json = serde_json::from_slice(&o.stdout)
            .with_context(|| format!("plan: {}", String::from_utf8_lossy(&o.stderr)))?;
        Ok((o.status.code(), json))
    };
    let (code, on) = plan("plain", "betas")?;
    let added: Vec<&str> = on["added"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
    ensure!(code == Some(0) && on["removed"].as_array().is_some_and(Vec::is_empty), "betas on: {on:#}");
    ensure!(!added.is_empty() && added.iter().all(|g| g.contains("beta")), "betas on added {added:?}");
    let (code, off) = plan("betas", "plain")?;
    let removed: Vec<&str> =
        off["removed"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
    ensure!(code == Some(1) && removed == added, "betas off: exit {code:?}, removed {removed:?}");
    ensure!(off["states"][3]["none"].as_array().is_some_and(|n| n.len() == removed.len()), "{off:#}");
    row.figure(format!(
        "betas on: +{} GVRs, exit 0; off: -{} (exit 1), {} readable in another version",
        added.len(),
        removed.len(),
        off["alsoServedAs"].as_object().map_or(0, |m| m.len())
    ));
    Ok(row)
}

/// A streaming list (client-go's reflectors with WatchListClient: a watch with
/// `sendInitialEvents`) is refused with 422 by an apiserver without the WatchList feature (1.33's
/// default) and served by one with it. The sidecar reads each apiserver's gates from its
/// `/metrics`; the edge sends streaming lists only where the feature is on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r13_streaming_lists() -> Result<()> {
    scenario("R13", "streaming lists only where WatchList is on (real)", streaming_lists()).await
}

async fn streaming_lists() -> Result<Row> {
    let mut row = Row::default();
    let c = start("r13", |_| {}).await?;
    let table = table_json(&c)?;
    let gates: BTreeMap<String, Value> = table["apiservers"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|a| (a["id"].as_str().unwrap_or_default().to_owned(), a["features"]["WatchList"].clone()))
        .collect();
    let want: BTreeMap<String, Value> =
        [("a", false), ("b", false), ("c", true)].map(|(id, on)| (id.to_owned(), Value::Bool(on))).into();
    ensure!(gates == want, "WatchList per apiserver in the table: {gates:?}");
    let path = "/api/v1/namespaces/default/configmaps?watch=1&sendInitialEvents=true\
                &resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true&timeoutSeconds=1";
    let direct = c.direct_client(TIMEOUT)?;
    for id in ["a", "b"] {
        let r = direct.get(format!("{}{path}", c.apiserver_url(id)?)).send().await?;
        row.requests += 1;
        ensure!(r.status() == 422, "straight to {id}: {} (want 422)", r.status());
    }
    let edge = c.client(Credentials::AdminToken, TIMEOUT)?;
    let base = c.envoy_url()?;
    let runs = 30;
    for _ in 0..runs {
        let r = edge.get(format!("{base}{path}")).send().await?;
        row.requests += 1;
        ensure!(r.status() == 200, "through the edge: {} {}", r.status(), r.text().await.unwrap_or_default());
        r.bytes().await?;
    }
    // Every one to c, as Envoy's access log says. Only this test's: a controller-manager through
    // the front door streams lists too (`watch=true`).
    let by = served_by(&c, "watch=1&sendInitialEvents=true", runs).await?;
    ensure!(by == BTreeMap::from([("c".to_owned(), runs)]), "streaming lists served by {by:?}");
    // Anyone's streaming list that reached a or b was of a GVR only they serve, none of which has
    // the feature: their own 422, which client-go answers with a list and a watch.
    let elsewhere: Vec<String> = access_log(&c)?
        .into_iter()
        .filter(|a| a.path.contains("sendInitialEvents=true") && a.apiserver.as_deref() != Some("c"))
        .filter(|a| a.status != 422 || a.cluster != "skewgate-set-a_b")
        .map(|a| format!("{} {} {} {:?}", a.status, a.cluster, a.path, a.apiserver))
        .collect();
    ensure!(
        elsewhere.is_empty(),
        "streaming lists that reached an apiserver without WatchList: {elsewhere:#?}"
    );
    row.figure(format!("{runs} streaming lists through the edge, all to c (a and b: 422 straight)"));
    finish(c, &mut row).await?;
    Ok(row)
}

/// Fields an apiserver drops while their feature gate is off: a claim's
/// `spec.volumeAttributesClassName` (VolumeAttributesClass) and a pod template's pod-level
/// `resources` (PodLevelResources), both off at 1.33's defaults. Straight to a, the field is gone;
/// through the edge, every write that sets one (JSON, protobuf, merge and JSON patches) reaches
/// c and keeps it; writes that set none go anywhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r16_gated_fields() -> Result<()> {
    scenario("R16", "writes of gated fields only where their gate is on (real)", gated_fields()).await
}

/// A claim in kube-apiserver's protobuf encoding, with `class` as its volume attributes class
/// (k8s.io/api core/v1 generated.proto: spec = 2, accessModes = 1, resources = 2 with requests = 2,
/// volumeAttributesClassName = 9).
const BOUND: &str = r#"{"status":{"phase":"Bound"}}"#;

fn protobuf_claim(name: &str, class: &str) -> Vec<u8> {
    skewgate_core::envelope::seal("v1", "PersistentVolumeClaim", 128, |claim| {
        claim.message(1, |m| m.string(1, name));
        claim.message(2, |spec| {
            spec.string(1, "ReadWriteOnce");
            spec.message(2, |resources| {
                resources.message(2, |entry| {
                    entry.string(1, "storage");
                    entry.message(2, |q| q.string(1, "1Gi"));
                })
            });
            spec.string(9, class);
        });
    })
}

async fn gated_fields() -> Result<Row> {
    let mut row = Row::default();
    let c = start("r16", |_| {}).await?;
    let table = table_json(&c)?;
    for gate in ["VolumeAttributesClass", "PodLevelResources"] {
        let gates: BTreeMap<String, Value> = table["apiservers"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|a| (a["id"].as_str().unwrap_or_default().to_owned(), a["features"][gate].clone()))
            .collect();
        let want: BTreeMap<String, Value> =
            [("a", false), ("b", false), ("c", true)].map(|(id, on)| (id.to_owned(), Value::Bool(on))).into();
        ensure!(gates == want, "{gate} per apiserver in the table: {gates:?}");
    }
    let edge = c.client(Credentials::AdminToken, TIMEOUT)?;
    let direct = c.direct_client(TIMEOUT)?;
    let base = c.envoy_url()?;
    for ns in ["r16-set", "r16-plain"] {
        let r = edge
            .post(format!("{base}/api/v1/namespaces"))
            .json(&json!({"metadata": {"name": ns}}))
            .send()
            .await?;
        row.requests += 1;
        ensure!(r.status() == 201, "namespace {ns}: {}", r.status());
    }
    // Straight to a: the field is dropped, as a plain load balancer loses it.
    let r = direct
        .post(format!("{}/api/v1/namespaces/r16-plain/persistentvolumeclaims", c.apiserver_url("a")?))
        .json(&volume_claim("straight-to-a", Some("gold")))
        .send()
        .await?;
    row.requests += 1;
    let stored: Value = r.json().await?;
    ensure!(stored["spec"].get("volumeAttributesClassName").is_none(), "a kept the class: {stored}");

    let set = format!("{base}/api/v1/namespaces/r16-set/persistentvolumeclaims");
    for i in 0..10 {
        let r = edge.post(&set).json(&volume_claim(&format!("json-{i}"), Some("gold"))).send().await?;
        row.requests += 1;
        ensure!(r.status() == 201, "json-{i}: {} {}", r.status(), r.text().await.unwrap_or_default());
    }
    for i in 0..5 {
        let r = edge
            .post(&set)
            .header("content-type", "application/vnd.kubernetes.protobuf")
            .header("accept", "application/json")
            .body(protobuf_claim(&format!("protobuf-{i}"), "gold"))
            .send()
            .await?;
        row.requests += 1;
        ensure!(r.status() == 201, "protobuf-{i}: {} {}", r.status(), r.text().await.unwrap_or_default());
    }
    let deployment = json!({
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "pod-level"},
        "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "pod-level"}},
                 "template": {"metadata": {"labels": {"app": "pod-level"}},
                              "spec": {"resources": {"requests": {"cpu": "100m", "memory": "64Mi"}},
                                       "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}}}
    });
    let r = edge
        .post(format!("{base}/apis/apps/v1/namespaces/r16-set/deployments"))
        .json(&deployment)
        .send()
        .await?;
    row.requests += 1;
    ensure!(r.status() == 201, "deployment: {} {}", r.status(), r.text().await.unwrap_or_default());

    // A claim's class changes only once it is bound (ValidatePersistentVolumeClaimUpdate): the
    // claims are marked bound through their status, which sets nothing gated.
    let plain = format!("{base}/api/v1/namespaces/r16-plain/persistentvolumeclaims");
    for i in 0..10 {
        let r = edge.post(&plain).json(&volume_claim(&format!("patched-{i}"), None)).send().await?;
        row.requests += 1;
        ensure!(r.status() == 201, "patched-{i}: {}", r.status());
        let r = edge
            .patch(format!("{plain}/patched-{i}/status"))
            .header("content-type", "application/merge-patch+json")
            .body(BOUND)
            .send()
            .await?;
        row.requests += 1;
        ensure!(
            r.status() == 200,
            "patched-{i} bound: {} {}",
            r.status(),
            r.text().await.unwrap_or_default()
        );
    }
    for i in 0..10 {
        let (content_type, body) = class_patch(i);
        let r = edge
            .patch(format!("{plain}/patched-{i}"))
            .header("content-type", content_type)
            .body(body)
            .send()
            .await?;
        row.requests += 1;
        ensure!(
            r.status() == 200,
            "patch of patched-{i}: {} {}",
            r.status(),
            r.text().await.unwrap_or_default()
        );
    }

    // As stored, read straight from c.
    let c_url = c.apiserver_url("c")?;
    let claims = |ns: &str| format!("{c_url}/api/v1/namespaces/{ns}/persistentvolumeclaims");
    let kept = |list: &Value, want: &str| -> Vec<String> {
        list["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|o| o["spec"]["volumeAttributesClassName"] != want)
            .map(|o| o["metadata"]["name"].as_str().unwrap_or_default().to_owned())
            .collect()
    };
    let list: Value = direct.get(claims("r16-set")).send().await?.json().await?;
    ensure!(list["items"].as_array().map_or(0, Vec::len) == 15, "claims in r16-set: {list}");
    let lost = kept(&list, "gold");
    ensure!(lost.is_empty(), "claims that lost their class: {lost:?}");
    let list: Value = direct.get(claims("r16-plain")).send().await?.json().await?;
    let lost: Vec<String> = kept(&list, "silver").into_iter().filter(|n| n.starts_with("patched-")).collect();
    ensure!(lost.is_empty(), "patched claims without their class: {lost:?}");
    let stored: Value = direct
        .get(format!("{c_url}/apis/apps/v1/namespaces/r16-set/deployments/pod-level"))
        .send()
        .await?
        .json()
        .await?;
    ensure!(
        stored["spec"]["template"]["spec"]["resources"]["requests"]["cpu"] == "100m",
        "the deployment lost its pod-level resources: {}",
        stored["spec"]["template"]["spec"]
    );

    let by = served_by(&c, "/namespaces/r16-set/", 16).await?;
    ensure!(by == BTreeMap::from([("c".to_owned(), 16)]), "writes that set a gated field served by {by:?}");
    let class_patches: Vec<Option<String>> = access_log(&c)?
        .into_iter()
        .filter(|a| a.path.contains("/persistentvolumeclaims/patched-") && !a.path.ends_with("/status"))
        .map(|a| a.apiserver)
        .collect();
    ensure!(
        class_patches.len() == 10 && class_patches.iter().all(|by| by.as_deref() == Some("c")),
        "patches that set the class served by {class_patches:?}"
    );
    let by = served_by(&c, "/namespaces/r16-plain/persistentvolumeclaims", 30).await?;
    ensure!(by.len() > 1, "writes that set nothing gated all went to {by:?}");
    row.figure("26 writes setting a gated field (JSON, protobuf, patches), all to c and kept; straight to a: dropped");
    finish(c, &mut row).await?;
    Ok(row)
}

// ---------------------------------------------------------------------------------------------
// 3. Shared state

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r03_shared_state() -> Result<()> {
    scenario("R3", "shared state (real)", shared_state()).await
}

async fn shared_state() -> Result<Row> {
    let mut row = Row::default();
    let c = start("r03", |_| {}).await?;
    let mut s = SUITE.shared_state(&c, "resource.k8s.io/v1").await?;
    let (dc, claim) = (&s.dc.clone(), &s.claim.clone());
    // Only c serves resource.k8s.io/v1; kubectl's validation (OpenAPI) goes through Envoy too.
    ensure!(s.ok(&["apply", "-f", dc]).await?.contains("deviceclass.resource.k8s.io/gpu-e2e created"));
    ensure!(s.ok(&["apply", "-f", claim]).await?.contains("resourceclaim.resource.k8s.io/claim-e2e created"));
    let dc_v1: Value = serde_json::from_str(&s.ok(&["get", "-f", dc, "-o", "json"]).await?)?;
    // The same object through the 1.33 servers' v1beta1 (one etcd, converted on read).
    let dc_beta: Value = serde_json::from_str(&s.ok(&["get", OLD_CLASSES, "gpu-e2e", "-o", "json"]).await?)?;
    ensure!(dc_beta["apiVersion"] == "resource.k8s.io/v1beta1", "{dc_beta}");
    ensure!(
        resource_version(&dc_beta) == resource_version(&dc_v1)
            && dc_beta["metadata"]["uid"] == dc_v1["metadata"]["uid"]
    );
    s.same_on_old_servers(OLD_CLASSES, "gpu-e2e", &dc_v1).await?;
    ensure!(
        s.ok(&["get", CLAIMS, "-n", "e2e-state", "-o", "name"])
            .await?
            .contains("resourceclaim.resource.k8s.io/claim-e2e")
    );
    s.label_patched(CLAIMS, "claim-e2e", Some("e2e-state")).await?;
    let claim_now: Value =
        serde_json::from_str(&s.ok(&["get", CLAIMS, "claim-e2e", "-n", "e2e-state", "-o", "json"]).await?)?;
    ensure!(claim_now["metadata"]["labels"]["e2e"] == "patched");
    // A ConfigMap, which every server serves: create, get, list, patch, delete.
    s.ok(&["create", "configmap", "cm-e2e", "-n", "e2e-state", "--from-literal=k=v"]).await?;
    let data = ["get", "configmap", "cm-e2e", "-n", "e2e-state", "-o", "jsonpath={.data.k}"];
    ensure!(s.ok(&data).await? == "v");
    ensure!(
        s.ok(&["get", "configmaps", "-n", "e2e-state", "-o", "name"]).await?.contains("configmap/cm-e2e")
    );
    let patch = r#"{"data":{"k":"w"}}"#;
    s.ok(&["patch", "configmap", "cm-e2e", "-n", "e2e-state", "--type=merge", "-p", patch]).await?;
    ensure!(s.ok(&data).await? == "w");
    s.ok(&["delete", "configmap", "cm-e2e", "-n", "e2e-state"]).await?;
    s.ok(&["delete", "-f", claim]).await?;
    s.ok(&["delete", OLD_CLASSES, "gpu-e2e"]).await?;
    let gone = s.fails(&["get", "-f", dc]).await?;
    ensure!(gone.contains("NotFound") || gone.contains("not found"), "{gone}");
    let runs = s.runs;
    row.requests += runs;
    row.figure(format!(
        "{runs} kubectl runs: DeviceClass v1 written via c, read as v1beta1 via a/b (same uid and \
         resourceVersion), claim CRUD, ConfigMap CRUD"
    ));
    finish(c, &mut row).await?;
    Ok(row)
}

// ---------------------------------------------------------------------------------------------
// 4. Watch

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r04_watch() -> Result<()> {
    scenario("R4", "watch 30 s (real)", watch()).await
}

async fn watch() -> Result<Row> {
    let mut row = Row::default();
    let c = start("r04", |_| {}).await?;
    let k = kubectl(&c)?;
    k.ok(&["create", "namespace", "e2e-watch"]).await?;
    let alice = c.client(Credentials::Alice, TIMEOUT)?;
    let base = format!("{}/apis/resource.k8s.io/v1/namespaces/e2e-watch/resourceclaims", c.envoy_url()?);
    let r = alice.post(&base).json(&claim("claim-first")).send().await?;
    ensure!(r.status() == 201, "{}", r.status());
    row.requests += 2;
    let watch = Watch::start(&k, &c, "e2e-watch")?;
    // The initial ADDED of the existing claim: the watch is established.
    let first = watch.events.recv_timeout(Duration::from_secs(20)).context("no initial event")?;
    ensure!(first.0 == "ADDED" && first.1 == "claim-first", "{first:?}");
    let written = write_claims(&alice, &base, Duration::from_secs(30)).await?;
    row.requests += written.len();
    let received = watch.stop_after(&written)?;
    same_events(&written, &received)?;
    let watches = served_by(&c, "watch=true", 1).await?;
    row.figure(format!(
        "{} events written, {} received in order; watch by {watches:?}",
        written.len(),
        received.len()
    ));
    finish(c, &mut row).await?;
    Ok(row)
}

// ---------------------------------------------------------------------------------------------
// 5. Peer loss

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r05_peer_loss() -> Result<()> {
    scenario("R5", "peer loss (real)", peer_loss()).await
}

async fn peer_loss() -> Result<Row> {
    let mut row = Row::default();
    // What the edge answers while c is away, at once: with the hold (R10 runs it on real
    // apiservers) each answer would come 10 s later, past the suite's wait for them.
    let mut c = start("r05", |o| o.hold = Some(Duration::ZERO)).await?;
    let before_outage = composed_table(&c).await?;
    let outage = SUITE.peer_loss(&mut c, &mut row, Duration::from_secs(30), Duration::from_secs(60)).await?;
    let e = &outage.kubectl_error;
    ensure!(e.contains("the server is currently unable to handle the request"), "{e}");
    let report = &outage.report;
    let outcomes = outage.outcomes(raced_the_kill)?;
    let Outcomes { outage_503, in_flight, recovered, .. } = &outcomes;
    let (unhealthy_after, healthy_after) = (outage.unhealthy_after, outage.healthy_after);
    println!(
        "Envoy saw c unhealthy {unhealthy_after:?} after the kill; {outage_503}×503 Status; back after \
         {recovered:?} (Envoy: healthy {healthy_after:?} after it was ready); {in_flight} raced the kill (503 Status)"
    );
    outcomes.check(&mut row, report)?;
    same_routing(&before_outage, &table_json(&c)?).context("c's GVRs left the table while it was away")?;
    let n = outcomes.back_after();
    row.figure(format!(
        "kill c: {outage_503}×503 Status, 0×404, unhealthy after {:.1}s; restart (native, ~real start-up) → \
         back after {:.1}s; {in_flight} raced the kill (503 Status)",
        unhealthy_after.as_secs_f64(),
        n.as_secs_f64()
    ));
    finish(c, &mut row).await?;
    Ok(row)
}

// ---------------------------------------------------------------------------------------------
// 6. Upgrade in place

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r06_upgrade_in_place() -> Result<()> {
    scenario("R6", "upgrade in place (real)", upgrade_in_place()).await
}

async fn upgrade_in_place() -> Result<Row> {
    let mut row = Row::default();
    let mut c = start("r06", |_| {}).await?;
    let first = c.table_on_disk()?.generation().to_string();
    SUITE.ten_by_servers(&c.table_on_disk()?)?;
    let load = SUITE.load(&c, 5, Duration::from_millis(20))?;
    let names = SUITE.ten_names();
    successes_after(&load, &names, Duration::ZERO, 10, Duration::from_secs(30)).await?;

    // A: b upgraded the way an operator does it: SIGTERM (unready, serving through its
    // --shutdown-delay-duration while Envoy takes it out), exit, the new binary's version.
    let drained = c.drain_apiserver("b", Duration::from_secs(10)).await?;
    c.stop_apiserver("b").await?;
    let booted = load.now();
    let boot = Instant::now();
    c.boot_apiserver("b", REAL_NEW, Duration::ZERO).await?;
    let table = until("the table follows b's upgrade", Duration::from_secs(60), || {
        let t = c.table_on_disk()?;
        Ok((t.generation() != first).then_some(t))
    })
    .await?;
    let followed = boot.elapsed();
    let healthy = c.wait_envoy_sees("b", true, Duration::from_secs(60)).await? + followed;
    ensure!(serving(&table, CLAIMS) == ids(&["b", "c"]), "{:?}", serving(&table, CLAIMS));
    ensure!(serving(&table, OLD_CLASSES) == ids(&["a"]), "{:?}", serving(&table, OLD_CLASSES));
    // The data path follows: b serves resourceclaims (by the access log).
    let alice = c.client(Credentials::Alice, TIMEOUT)?;
    let claims = format!("{}/apis/resource.k8s.io/v1/namespaces/default/resourceclaims", c.envoy_url()?);
    for i in 0..60 {
        let r = alice.get(format!("{claims}?e2e-mark=r06-{i}")).send().await?;
        ensure!(r.status() == 200, "{}", r.status());
    }
    row.requests += 60;
    let claims_by = served_by(&c, "e2e-mark=r06-", 60).await?;
    ensure!(claims_by.keys().cloned().collect::<Vec<_>>() == ids(&["b", "c"]), "{claims_by:?}");
    let phase_a_end = load.now();

    // B: b killed and started again at once (same version): only requests in flight may fail.
    let table_before = table_json(&c)?;
    let killed = load.now();
    c.kill_apiserver("b").await?;
    c.start_apiserver("b", REAL_NEW).await?;
    c.wait_envoy_sees("b", true, Duration::from_secs(10)).await?;
    successes_after(&load, &names, load.now(), 10, Duration::from_secs(30)).await?;
    let report = load.finish().await;
    println!("{}", report.summary());
    let failures: Vec<&Record> = report.failures();
    let (in_flight, unexpected): (Vec<&Record>, Vec<&Record>) =
        failures.into_iter().partition(|r| r.started >= phase_a_end && raced_the_kill(r, killed));
    println!(
        "b: drained in {drained:?}; booted at {booted:?}; the table followed {followed:?} after the boot, \
         Envoy saw b healthy {healthy:?} after it; {} raced the kill (503 Status)",
        in_flight.len()
    );
    row.tally(&report, &unexpected, "failures")?;
    same_routing(&table_before, &table_json(&c)?).context("the abrupt restart changed the table")?;
    row.figure(format!(
        "b 1.33→1.36: drain {:.1}s, table followed {:.1}s after boot, healthy {:.1}s after boot, 0 failed; \
         kill+restart: {} raced the kill → 503 Status; claims after → {claims_by:?}",
        drained.as_secs_f64(),
        followed.as_secs_f64(),
        healthy.as_secs_f64(),
        in_flight.len()
    ));
    finish(c, &mut row).await?;
    Ok(row)
}

// ---------------------------------------------------------------------------------------------
// 7. Identity, anonymous requests, health checks

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r07_identity() -> Result<()> {
    scenario("R7", "identity and edge (real)", identity()).await
}

async fn identity() -> Result<Row> {
    let mut row = Row::default();
    let c = start("r07", |_| {}).await?;
    let base = c.envoy_url()?;
    // R1: every host of every cluster (twins without the certificate included) passes Envoy's
    // health checks on real apiservers.
    let hosts = c.envoy_hosts().await?;
    ensure!(hosts.keys().any(|(cl, _)| cl.starts_with("skewgate-anonymous-")), "no twins: {hosts:?}");
    ensure!(hosts.values().all(|h| *h), "unhealthy hosts: {hosts:?}");

    let spoof = [
        ("X-Remote-User", "admin"),
        ("X-Remote-Group", "system:masters"),
        ("X-Remote-Uid", "0"),
        ("X-Remote-Extra-Scopes", "all"),
    ];
    let review = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"});
    let whoami = format!("{base}/apis/authentication.k8s.io/v1/selfsubjectreviews");
    let alice = c.client(Credentials::Alice, TIMEOUT)?;
    let alice_extra = json!({CREDENTIAL_ID: [format!("X509SHA256={}", cert_sha256(&c.pki.alice.cert)?)]});
    let mut reviewers: BTreeSet<String> = BTreeSet::new();
    // 48: Envoy balances by least request over two workers, so 12 missed one of three apiservers
    // about once in 40 runs.
    for i in 0..48 {
        let mut req = alice.post(format!("{whoami}?e2e-mark=r07-{i}")).json(&review);
        if i % 2 == 1 {
            for (k, v) in spoof {
                req = req.header(k, v);
            }
        }
        let r: Value = req.send().await?.json().await?;
        row.requests += 1;
        let user = &r["status"]["userInfo"];
        ensure!(user["username"] == "alice", "{r}");
        ensure!(user["groups"] == json!(["devs", "system:authenticated"]), "{r}");
        ensure!(user["extra"] == alice_extra, "R3, the credential id: {r}");
        ensure!(user.get("uid").is_none_or(|u| u == ""), "{r}");
    }
    reviewers.extend(served_by(&c, "e2e-mark=r07-", 48).await?.into_keys());
    ensure!(reviewers == BTreeSet::from(["a", "b", "c"].map(String::from)), "{reviewers:?}");
    let k = kubectl(&c)?;
    let w: Value = serde_json::from_str(&k.ok(&["auth", "whoami", "-o", "json"]).await?)?;
    ensure!(w["status"]["userInfo"]["username"] == "alice", "{w}");
    let admin = k.with_context("skewgate-admin").ok(&["auth", "whoami", "-o", "json"]).await?;
    let admin: Value = serde_json::from_str(&admin)?;
    ensure!(admin["status"]["userInfo"]["username"] == "admin", "{admin}");
    ensure!(
        admin["status"]["userInfo"]["groups"] == json!(["system:masters", "system:authenticated"]),
        "{admin}"
    );
    row.requests += 2;

    // R2: no credentials → each apiserver's own anonymous answer; a bad token → its 401.
    let anonymous = c.client(Credentials::Anonymous, TIMEOUT)?;
    for (path, status) in
        [("/version", 200), ("/readyz", 200), ("/livez", 200), ("/api/v1/namespaces", 403), ("/apis", 403)]
    {
        let r = anonymous.get(format!("{base}{path}")).header("accept", V2).send().await?;
        row.requests += 1;
        ensure!(r.status() == status, "anonymous {path}: {} (want {status})", r.status());
        if status == 403 {
            let body: Value = r.json().await?;
            ensure!(body["message"].as_str().unwrap_or("").contains("system:anonymous"), "{body}");
        }
    }
    let anon_lines =
        access_log(&c)?.into_iter().filter(|a| a.path == "/api/v1/namespaces").collect::<Vec<_>>();
    ensure!(
        anon_lines.iter().all(|a| a.cluster.starts_with("skewgate-anonymous-") && a.apiserver.is_some()),
        "{anon_lines:?}"
    );
    let stranger = c.out.join("stranger.kubeconfig");
    let text = std::fs::read_to_string(&c.kubeconfig)?;
    let head = text.split("users:").next().unwrap_or("");
    std::fs::write(&stranger, format!("{head}users:\n- name: alice\n  user: {{token: not-a-real-token}}\n"))?;
    let e = Kubectl::new(&stranger, &c.out.join("kube-cache"))?
        .fails(&["get", "--raw", "/api/v1/namespaces"])
        .await?;
    row.requests += 1;
    ensure!(e.contains("Unauthorized"), "{e}");
    // Spoofed X-Remote-* without credentials: still anonymous.
    let mut req = anonymous.get(format!("{base}/api/v1/namespaces"));
    for (k, v) in spoof {
        req = req.header(k, v);
    }
    let r = req.send().await?;
    row.requests += 1;
    ensure!(r.status() == 403, "spoofed headers without credentials: {}", r.status());

    // --anonymous-auth=false on the apiservers: their 401 through Envoy.
    let off = start("r07-anonymous-off", |o| o.anonymous_auth = false).await?;
    let anonymous = off.client(Credentials::Anonymous, TIMEOUT)?;
    for path in ["/version", "/readyz", "/api/v1/namespaces"] {
        let r = anonymous.get(format!("{}{path}", off.envoy_url()?)).send().await?;
        row.requests += 1;
        ensure!(r.status() == 401, "anonymous off {path}: {}", r.status());
    }
    let r =
        off.client(Credentials::Alice, TIMEOUT)?.get(format!("{}/version", off.envoy_url()?)).send().await?;
    row.requests += 1;
    ensure!(r.status() == 200, "alice with anonymous off: {}", r.status());
    finish(off, &mut Row::default()).await?;
    row.figure(format!(
        "health checks pass; alice = alice/[devs] + credential id on {reviewers:?}, spoofing dropped; token = \
         admin; anonymous /version 200, resources 403 (401 with --anonymous-auth=false); bad token 401"
    ));
    finish(c, &mut row).await?;
    Ok(row)
}

// ---------------------------------------------------------------------------------------------
// 8. A crash and an immediate restart (what the kubelet does after an OOM kill)

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r08_crash_restart() -> Result<()> {
    scenario("R8", "crash + restart (real)", crash_restart()).await
}

async fn crash_restart() -> Result<Row> {
    let mut row = Row::default();
    let mut c = start("r08", |_| {}).await?;
    let load = SUITE.load(&c, 5, Duration::from_millis(20))?;
    let names = SUITE.ten_names();
    successes_after(&load, &names, Duration::ZERO, 10, Duration::from_secs(30)).await?;
    let mut kills = Vec::new();
    for _ in 0..3 {
        kills.push(load.now());
        c.kill_apiserver("b").await?;
        // The same version at once: a restarted kube-apiserver listens ~1 s after it starts
        // and answers requests before its /readyz is ok (403 until RBAC is synced).
        c.start_apiserver("b", REAL_OLD).await?;
        c.wait_envoy_sees("b", true, Duration::from_secs(10)).await?;
        successes_after(&load, &names, load.now(), 5, Duration::from_secs(30)).await?;
    }
    let report = load.finish().await;
    println!("{}", report.summary());
    let (raced, unexpected): (Vec<&Record>, Vec<&Record>) =
        report.failures().into_iter().partition(|r| kills.iter().any(|k| raced_the_kill(r, *k)));
    let mut statuses: BTreeMap<u16, usize> = BTreeMap::new();
    for r in &unexpected {
        *statuses.entry(r.status.unwrap_or(0)).or_default() += 1;
    }
    row.requests += report.records.len();
    row.failures = unexpected.len();
    row.figure(format!(
        "3 × SIGKILL + restart of b: {} raced the kill (503 Status), other failures by status {statuses:?}",
        raced.len()
    ));
    ensure!(
        unexpected.is_empty(),
        "{} requests reached b before it was ready again ({statuses:?}):{}",
        unexpected.len(),
        listing(&report, &unexpected)
    );
    finish(c, &mut row).await?;
    Ok(row)
}

// ---------------------------------------------------------------------------------------------
// 10. An upgrade's restarts of the only server of an API, as kubectl lives through them

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r10_kubectl_rides_out_restarts() -> Result<()> {
    scenario("R10", "kubectl through restarts of the sole server (real)", kubectl_through_restarts()).await
}

/// c, the only apiserver of resource.k8s.io/v1, restarts twice as an upgrade restarts it:
/// SIGTERM (`/readyz` fails its `shutdown` check; it serves out its shutdown delay), exit, the
/// same binary and flags again, ready once its post-start hooks are done. A real kubectl lists
/// ResourceClaims in a loop meanwhile: the edge keeps sending them to c while it serves, and its
/// 503s while c is away say `Retry-After`, which client-go waits out. Not one kubectl run fails.
/// Beside it a client that never retries lists them too: its requests wait at the edge while c
/// is away; only each Envoy worker's first one after c went gets the 503 at once.
async fn kubectl_through_restarts() -> Result<Row> {
    let mut row = Row::default();
    let mut c = start("r10", |_| {}).await?;
    let k = Kubectl::new(&c.kubeconfig, &c.out.join("kubectl-cache"))?;
    let args = ["get", "resourceclaims.v1.resource.k8s.io", "-A"];
    until_ok(&k, &args).await?;
    let before = edge_5xx(&c).await?;
    let looping = clients::Looping::start(&k, &args);
    let raw = raw_loop(c.client(Credentials::AdminToken, Duration::from_secs(30))?, c.envoy_url()?);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut restarts = Vec::new();
    for _ in 0..2 {
        let started = Instant::now();
        c.drain_apiserver("c", Duration::from_secs(30)).await?;
        c.stop_apiserver("c").await?;
        c.start_apiserver("c", REAL_NEW).await?;
        restarts.push(started.elapsed());
        tokio::time::sleep(Duration::from_secs(3)).await;
    }
    let runs = looping.stop().await?;
    let (statuses, raw_slowest) = raw.stop().await?;
    let answered = edge_5xx(&c).await? - before;
    let held = c.envoy()?.prometheus().await?;
    let held: Vec<&str> = held.lines().filter(|l| l.starts_with("skewgate_held_requests_total")).collect();
    let slowest = runs.slowest();
    row.requests += runs.0.len() + statuses.values().sum::<usize>();
    row.failures = runs.failures().len();
    row.figure(format!(
        "2 restarts of c ({:?}): {} kubectl runs, {} failed, slowest {:.1}s; a client that never retries: \
         {statuses:?}, slowest {:.1}s; the edge answered {answered} × 5xx; {held:?}",
        restarts.iter().map(|d| format!("{:.1}s", d.as_secs_f64())).collect::<Vec<_>>(),
        runs.0.len(),
        runs.failures().len(),
        slowest.as_secs_f64(),
        raw_slowest.as_secs_f64(),
    ));
    runs.ensure_none_failed()?;
    // At most one per Envoy worker (2) and restart (2).
    let at_once = statuses.iter().filter(|(s, _)| **s != 200).map(|(_, n)| n).sum::<usize>();
    ensure!(at_once <= 4, "the client that never retries saw {statuses:?}");
    finish(c, &mut row).await?;
    Ok(row)
}

/// A client that lists ResourceClaims in a loop and never sends a request again: what each
/// answer was, and the slowest.
fn raw_loop(client: reqwest::Client, base: String) -> Background<(BTreeMap<u16, usize>, Duration)> {
    Background::start(|stopped| async move {
        let (mut statuses, mut slowest) = (BTreeMap::new(), Duration::ZERO);
        while !stopped.load(Ordering::SeqCst) {
            let sent = Instant::now();
            let status =
                client.get(format!("{base}/apis/resource.k8s.io/v1/resourceclaims")).send().await?.status();
            slowest = slowest.max(sent.elapsed());
            *statuses.entry(status.as_u16()).or_default() += 1;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok((statuses, slowest))
    })
}

/// A task that runs until told to stop, then hands back what it found.
struct Background<T> {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<Result<T>>,
}

impl<T: Send + 'static> Background<T> {
    fn start<F>(run: impl FnOnce(Arc<AtomicBool>) -> F) -> Self
    where
        F: std::future::Future<Output = Result<T>> + Send + 'static,
    {
        let stop = Arc::new(AtomicBool::new(false));
        let task = tokio::spawn(run(stop.clone()));
        Self { stop, task }
    }

    async fn stop(self) -> Result<T> {
        self.stop.store(true, Ordering::SeqCst);
        self.task.await?
    }
}

/// 5xx answers at Envoy's listener.
async fn edge_5xx(c: &Cluster) -> Result<u64> {
    c.envoy()?.stat("http.apiserver.downstream_rq_5xx").await
}

/// Until `kubectl ARGS` succeeds (the edge answers once every apiserver is ready).
async fn until_ok(k: &Kubectl, args: &[&str]) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let out = k.run(args).await?;
        if out.ok {
            return Ok(());
        }
        ensure!(Instant::now() < deadline, "kubectl {args:?} still fails: {}", out.stderr);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

// ---------------------------------------------------------------------------------------------
// 11. A real kube-controller-manager through the edge: garbage collection and namespace deletion
//     of an API only c serves

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r11_controllers() -> Result<()> {
    scenario("R11", "garbage collector and namespace controller through the edge (real)", controllers()).await
}

/// A real kube-controller-manager (`KUBE_CONTROLLER_MANAGER=PATH`, garbage collector and
/// namespace controller) talks to the cluster through the edge, as a control plane's talks to
/// its load balancer. ResourceClaims (resource.k8s.io/v1: only c serves it) own ConfigMaps: the
/// dependent of a deleted claim goes, the dependent of a live one stays; a deleted namespace
/// that holds claims is finalized with none left in etcd (read straight from c).
async fn controllers() -> Result<Row> {
    let mut row = Row::default();
    let mut c = start("r11", |_| {}).await?;
    ensure!(
        c.controller_manager.is_some(),
        "R11 runs a real kube-controller-manager: make e2e KUBE_CONTROLLER_MANAGER=PATH (or set {})",
        real::KUBE_CONTROLLER_MANAGER_ENV
    );
    let k = Kubectl::new(&c.kubeconfig, &c.out.join("kubectl-cache"))?.with_context("skewgate-admin");
    let direct = Kubectl::new(&c.kubeconfig, &c.out.join("kubectl-cache-c"))?.with_context("direct-c");
    let ns = "r11";
    k.ok(&["create", "namespace", ns]).await?;
    for name in ["owner-gone", "owner-stays"] {
        k.ok_with_stdin(&["apply", "-f", "-"], &claim_yaml(name, ns, "gpu")).await?;
        let uid = k.ok(&["-n", ns, "get", CLAIMS, name, "-o", "jsonpath={.metadata.uid}"]).await?;
        let dependent = json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": format!("of-{name}"), "namespace": ns, "ownerReferences": [{
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "name": name, "uid": uid.trim()
            }]},
            "data": {"k": "v"}
        });
        k.ok_with_stdin(&["apply", "-f", "-"], &dependent.to_string()).await?;
    }
    let deleted = Instant::now();
    k.ok(&["-n", ns, "delete", CLAIMS, "owner-gone", "--wait=false"]).await?;
    let collected = until(
        "the garbage collector deletes the dependent of the deleted claim",
        Duration::from_secs(60),
        || {
            let out = std::process::Command::new(paths::kubectl_binary()?)
                .args(["--kubeconfig", &c.kubeconfig.display().to_string(), "--context", "skewgate-admin"])
                .args(["-n", ns, "get", "configmap", "of-owner-gone", "--ignore-not-found", "-o", "name"])
                .output()?;
            Ok(String::from_utf8_lossy(&out.stdout).trim().is_empty().then(|| deleted.elapsed()))
        },
    )
    .await?;
    k.ok(&["-n", ns, "get", "configmap", "of-owner-stays"])
        .await
        .context("the dependent of a live claim was deleted")?;
    let deleting = Instant::now();
    k.ok(&["delete", "namespace", ns, "--wait=true", "--timeout=60s"]).await?;
    let namespace_gone = deleting.elapsed();
    let left = direct.ok(&["get", CLAIMS, "-A", "-o", "name"]).await?;
    ensure!(left.trim().is_empty(), "claims left in etcd after their namespace was deleted: {left}");
    let manager = c.controller_manager.as_mut().context("controller-manager")?;
    ensure!(manager.running(), "kube-controller-manager exited:\n{}", manager.log_tail(30));
    row.figure(format!(
        "dependent of a deleted claim collected in {:.1}s; namespace with claims deleted in {:.1}s (the namespace controller waits 5 s first); 0 claims left",
        collected.as_secs_f64(),
        namespace_gone.as_secs_f64()
    ));
    finish(c, &mut row).await?;
    Ok(row)
}

// ---------------------------------------------------------------------------------------------
// 12. A watch on a draining apiserver moves

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r12_watches_leave_a_draining_apiserver() -> Result<()> {
    scenario("R12", "a watch leaves a draining apiserver, losing nothing (real)", watch_moves()).await
}

/// A client that watches ConfigMaps as client-go's reflector does (a list for the
/// resourceVersion, a watch from it, and another from the last resourceVersion it saw whenever
/// the server ends one) while ConfigMaps are created 5 a second, and a rolling restart: each
/// apiserver in turn drained, stopped and started again as an upgrade does it. The one the watch
/// is on (at least one of them) ends it itself (`--shutdown-watch-termination-grace-period`,
/// which the launcher gives), the client watches again through the edge, which sends it to
/// another apiserver, and every apiserver exits in seconds rather than at its 60 s shutdown
/// timeout. Every ConfigMap created shows up exactly once, in order.
async fn watch_moves() -> Result<Row> {
    let mut row = Row::default();
    let mut c = start("r12", |_| {}).await?;
    let k = Kubectl::new(&c.kubeconfig, &c.out.join("kubectl-cache"))?;
    k.ok(&["create", "namespace", "e2e-drain"]).await?;
    let path = "/api/v1/namespaces/e2e-drain/configmaps";
    let client = c.client(Credentials::AdminToken, Duration::from_secs(600))?;
    let reflector = Reflector::start(client.clone(), format!("{}{path}", c.envoy_url()?));
    let writer = writer(client, format!("{}{path}", c.envoy_url()?));
    tokio::time::sleep(Duration::from_secs(2)).await;
    ensure!(reflector.watching() == 1, "{} watches before any drain", reflector.watching());
    let mut steps = Vec::new();
    for (id, profile) in ERAS {
        let ends = reflector.ended().len();
        let terminated = Instant::now();
        c.drain_apiserver(id, Duration::from_secs(30)).await?;
        c.stop_apiserver(id).await?;
        let exited = terminated.elapsed();
        ensure!(exited < Duration::from_secs(20), "{id} took {exited:?} to exit: a watch held it");
        let ended: Vec<Duration> =
            reflector.ended().iter().skip(ends).map(|at| at.duration_since(terminated)).collect();
        steps.push(match ended.as_slice() {
            [] => format!("{id} exited after {:.1}s", exited.as_secs_f64()),
            [at, ..] => format!(
                "{id} ended the watch {:.1}s after SIGTERM and exited after {:.1}s",
                at.as_secs_f64(),
                exited.as_secs_f64()
            ),
        });
        c.start_apiserver(id, profile).await?;
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    let created = writer.stop().await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let watches = reflector.watching();
    let events = reflector.run.stop().await?;
    row.requests += created.len() + watches;
    let added: Vec<&str> =
        events.iter().filter(|(t, _, _)| t == "ADDED").map(|(_, n, _)| n.as_str()).collect();
    let unique: BTreeSet<&str> = added.iter().copied().collect();
    let missing: Vec<&String> = created.iter().filter(|n| !unique.contains(n.as_str())).collect();
    let versions: Vec<u64> = events.iter().map(|(_, _, rv)| *rv).collect();
    row.figure(format!(
        "{}; {} ConfigMaps created, {} ADDED seen over {} watches, {} missing, {} twice",
        steps.join("; "),
        created.len(),
        added.len(),
        watches,
        missing.len(),
        added.len() - unique.len()
    ));
    ensure!(missing.is_empty(), "events lost: {missing:?}");
    ensure!(added.len() == unique.len(), "events seen twice: {added:?}");
    ensure!(versions.windows(2).all(|w| w[0] < w[1]), "events out of order: {versions:?}");
    ensure!(watches >= 2, "{watches} watches: it never moved");
    finish(c, &mut row).await?;
    Ok(row)
}

/// Watches as client-go's reflector does; see [`watch_moves`].
struct Reflector {
    run: Background<Vec<Event>>,
    ended: Arc<std::sync::Mutex<Vec<Instant>>>,
    /// Watches answered so far (their stream open).
    watching: Arc<AtomicUsize>,
}

/// (type, name, resourceVersion) of an event other than a bookmark.
type Event = (String, String, u64);

impl Reflector {
    fn start(client: reqwest::Client, url: String) -> Self {
        let ended = Arc::new(std::sync::Mutex::new(Vec::new()));
        let watching = Arc::new(AtomicUsize::new(0));
        let (ends, opened) = (ended.clone(), watching.clone());
        let run = Background::start(|stopped| async move {
            let list: Value = client.get(&url).send().await?.error_for_status()?.json().await?;
            let mut rv =
                list["metadata"]["resourceVersion"].as_str().context("a list's resourceVersion")?.to_owned();
            // What the list holds is the reflector's first ADDED events (an informer's initial sync):
            // a ConfigMap written before the list is there, not in the watch.
            let mut events: Vec<Event> = list["items"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|item| {
                    let meta = &item["metadata"];
                    let field = |k: &str| meta[k].as_str().unwrap_or_default().to_owned();
                    ("ADDED".to_owned(), field("name"), field("resourceVersion").parse().unwrap_or_default())
                })
                .collect();
            events.sort_by_key(|(_, _, rv)| *rv);
            while !stopped.load(Ordering::SeqCst) {
                let watch = format!("{url}?watch=1&allowWatchBookmarks=true&resourceVersion={rv}");
                let mut resp = match client.get(&watch).send().await {
                    Ok(r) if r.status() == 200 => r,
                    // What client-go does with a failed watch: wait a little, watch again.
                    Ok(r) => {
                        ensure!(
                            r.status() != 410,
                            "resourceVersion {rv} gone: the watch fell too far behind"
                        );
                        tokio::time::sleep(Duration::from_millis(500)).await;
                        continue;
                    }
                    Err(_) => {
                        tokio::time::sleep(Duration::from_millis(500)).await;
                        continue;
                    }
                };
                opened.fetch_add(1, Ordering::SeqCst);
                let mut pending = Vec::new();
                loop {
                    let chunk = tokio::select! {
                        chunk = resp.chunk() => chunk,
                        () = tokio::time::sleep(Duration::from_millis(200)) => {
                            if stopped.load(Ordering::SeqCst) { break }
                            continue;
                        }
                    };
                    let Ok(Some(chunk)) = chunk else { break };
                    pending.extend_from_slice(&chunk);
                    while let Some(at) = pending.iter().position(|b| *b == b'\n') {
                        let line: Vec<u8> = pending.drain(..=at).collect();
                        let event: Value = serde_json::from_slice(&line)?;
                        let kind = event["type"].as_str().unwrap_or_default().to_owned();
                        let meta = &event["object"]["metadata"];
                        let version = meta["resourceVersion"].as_str().unwrap_or_default().to_owned();
                        ensure!(kind != "ERROR", "watch error: {event}");
                        if kind != "BOOKMARK" {
                            let name = meta["name"].as_str().unwrap_or_default().to_owned();
                            events.push((kind, name, version.parse().unwrap_or_default()));
                        }
                        rv = version;
                    }
                }
                ends.lock().map_err(|_| anyhow::anyhow!("poisoned"))?.push(Instant::now());
            }
            Ok(events)
        });
        Self { run, ended, watching }
    }

    /// Watches answered so far.
    fn watching(&self) -> usize {
        self.watching.load(Ordering::SeqCst)
    }

    /// When each watch so far ended.
    fn ended(&self) -> Vec<Instant> {
        self.ended.lock().map(|e| e.clone()).unwrap_or_default()
    }
}

/// Creates ConfigMaps, 5 a second, sending one again (client-go's way) only when the edge says
/// it reached no apiserver: the names created.
fn writer(client: reqwest::Client, url: String) -> Background<Vec<String>> {
    Background::start(|stopped| async move {
        let mut created = Vec::new();
        for i in 0.. {
            if stopped.load(Ordering::SeqCst) {
                break;
            }
            let name = format!("cm-{i:05}");
            let body = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}});
            for _ in 0..10 {
                let resp = client.post(&url).json(&body).send().await?;
                match resp.status().as_u16() {
                    201 => {
                        created.push(name.clone());
                        break;
                    }
                    503 if resp.headers().contains_key("retry-after") => {
                        tokio::time::sleep(Duration::from_secs(1)).await
                    }
                    other => bail!("creating {name}: {other} {}", resp.text().await?),
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Ok(created)
    })
}

// ---------------------------------------------------------------------------------------------
// 15. A release upgrade: the old release's binaries replaced by the new one's, apiserver by
//     apiserver as kubeadm does, then the controller-manager

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r15_release_upgrade() -> Result<()> {
    scenario("R15", "release upgrade (real)", release_upgrade()).await
}

/// Lists of `names` (in `default` where the resource is namespaced).
fn list_targets(names: &BTreeSet<String>, all: &[real::Listable]) -> Vec<skewgate_harness::load::Target> {
    all.iter()
        .filter(|l| names.contains(&l.name()))
        .map(|l| {
            let ns = l.namespaced.then_some("default");
            skewgate_harness::load::Target::list(&l.group, &l.version, &l.resource, ns)
        })
        .collect()
}

async fn release_upgrade() -> Result<Row> {
    let mut row = Row::default();
    let binaries = real::Binaries::from_env()?
        .context("this suite runs real binaries: make e2e KUBE_APISERVER=PATH ETCD=PATH")?;
    // The operator's old release when given (OLD_KUBE_APISERVER); else the new binary emulating
    // 1.33, as the other scenarios' old era.
    let old = binaries.old.as_ref().map_or(REAL_OLD.to_string(), |o| o.kube_apiserver.display().to_string());
    let work = fresh_dir(Path::new(env!("CARGO_TARGET_TMPDIR")), "e2e-real", "r15-discovery");
    let old_docs = real::discovery_of(&binaries, &real::Spec::parse(&old)?, &work.join("old")).await?;
    let new_docs = real::discovery_of(&binaries, &real::Spec::parse(REAL_NEW)?, &work.join("new")).await?;
    let _ = std::fs::remove_dir_all(&work);
    let mut all = old_docs.listable()?;
    all.extend(new_docs.listable()?);
    all.sort();
    all.dedup();
    let names = |d: &real::Discovery| -> Result<BTreeSet<String>> {
        Ok(d.listable()?.iter().map(real::Listable::name).collect())
    };
    let (was, will) = (names(&old_docs)?, names(&new_docs)?);
    let added: BTreeSet<String> = will.difference(&was).cloned().collect();
    let removed: BTreeSet<String> = was.difference(&will).cloned().collect();
    ensure!(!added.is_empty() || !removed.is_empty(), "{old} and {REAL_NEW} serve the same GVRs");
    let both: BTreeSet<String> = ["configmaps.v1", "pods.v1"].map(str::to_owned).into();

    let mut c = start("r15", |o| {
        for a in &mut o.apiservers {
            a.profile = old.clone();
        }
    })
    .await?;
    let alice = c.client(Credentials::Alice, TIMEOUT)?;
    let settings = |workers| skewgate_harness::load::Settings {
        workers,
        pause: Duration::from_millis(20),
        timeout: TIMEOUT,
    };
    // What only the old release serves is asked for until its last server goes.
    let mut removed_load = Some(skewgate_harness::load::Load::start(
        &alice,
        &c.envoy_url()?,
        list_targets(&both.union(&removed).cloned().collect(), &all),
        settings(3),
    ));
    let mut added_load = None;
    let mut steps = Vec::new();
    for (i, id) in ["a", "b", "c"].into_iter().enumerate() {
        // c is the last server of what only the old release serves: those requests stop here.
        if let Some(load) = removed_load.take_if(|_| id == "c") {
            let report = load.finish().await;
            println!("{}", report.summary());
            row.tally(&report, &report.failures(), "failures before the last old apiserver went")?;
        }
        let generation = c.table_on_disk()?.generation().to_string();
        upgrade_one(&mut c, id, &generation).await?;
        let table = c.table_on_disk()?;
        let upgraded = ids(&["a", "b", "c"][..=i]);
        for name in &added {
            ensure!(
                serving(&table, name) == upgraded,
                "after {id}'s upgrade {name} is routed to {:?}, not the upgraded {upgraded:?}",
                serving(&table, name)
            );
        }
        let old_ones = ids(&["a", "b", "c"][i + 1..]);
        for name in &removed {
            ensure!(
                serving(&table, name) == old_ones,
                "after {id}'s upgrade {name} is routed to {:?}, not {old_ones:?}",
                serving(&table, name)
            );
        }
        steps.push(match old_ones.is_empty() {
            false => format!(
                "{id} upgraded: the {} added served by {} only, the {} removed by {} only",
                added.len(),
                upgraded.join(","),
                removed.len(),
                old_ones.join(",")
            ),
            true => format!("{id} upgraded: every apiserver serves the same again"),
        });
        if added_load.is_none() && !added.is_empty() {
            added_load = Some(skewgate_harness::load::Load::start(
                &alice,
                &c.envoy_url()?,
                list_targets(&both.union(&added).cloned().collect(), &all),
                settings(3),
            ));
        }
    }
    let upgraded_kcm = c.upgrade_controller_manager().await?;
    if upgraded_kcm {
        tokio::time::sleep(Duration::from_secs(5)).await;
        let running = c.controller_manager.as_mut().is_some_and(|m| m.running());
        ensure!(
            running,
            "the new kube-controller-manager stopped: {}",
            c.controller_manager.as_ref().map(|m| m.log_tail(20)).unwrap_or_default()
        );
    }
    if let Some(load) = added_load {
        let report = load.finish().await;
        println!("{}", report.summary());
        row.tally(&report, &report.failures(), "failures after the first apiserver was upgraded")?;
    }
    let version = |b: &Path| {
        real::version_of(b).unwrap_or_default().split_whitespace().last().unwrap_or_default().to_owned()
    };
    let from = binaries.old.as_ref().map_or("1.33 (emulated)".to_string(), |o| version(&o.kube_apiserver));
    let to = binaries.kube_apiserver.as_deref().map(version).unwrap_or_default();
    row.figure(format!(
        "{from} → {to}: added {}, removed {}; {}; kube-controller-manager {}",
        added.iter().cloned().collect::<Vec<_>>().join(", "),
        match removed.is_empty() {
            true => "none".to_string(),
            false => removed.iter().cloned().collect::<Vec<_>>().join(", "),
        },
        steps.join("; "),
        if upgraded_kcm { "upgraded last" } else { "not upgraded (OLD_KUBE_CONTROLLER_MANAGER not given)" }
    ));
    finish(c, &mut row).await?;
    Ok(row)
}

/// `id` upgraded as kubeadm does: drained (SIGTERM, serving through its shutdown delay while
/// Envoy takes it out), stopped, the new binary started with the same flags; returns once the
/// table followed and Envoy sends it requests.
async fn upgrade_one(c: &mut Cluster, id: &str, generation: &str) -> Result<()> {
    c.drain_apiserver(id, Duration::from_secs(10)).await?;
    c.stop_apiserver(id).await?;
    c.boot_apiserver(id, REAL_NEW, Duration::ZERO).await?;
    until(&format!("the table follows {id}'s upgrade"), Duration::from_secs(90), || {
        Ok((c.table_on_disk()?.generation() != generation).then_some(()))
    })
    .await?;
    c.wait_envoy_sees(id, true, Duration::from_secs(60)).await?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// 9. OpenAPI through Envoy: kubectl explain and validation against the composed documents
//    (docs/openapi.md)

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r09_openapi() -> Result<()> {
    scenario("R9", "openapi: explain, apply (real)", openapi()).await
}

async fn openapi() -> Result<Row> {
    let mut row = Row::default();
    let c = start("r09", |_| {}).await?;
    let claim = c.out.join("claim.yaml");
    std::fs::write(&claim, claim_yaml("claim-e2e", "default", "gpu-e2e"))?;
    let claim = claim.to_str().context("path")?.to_string();
    let mut failed: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    // A fresh cache each run: kubectl reads the OpenAPI v3 index again.
    for i in 0..12 {
        let k = kubectl(&c)?.with_cache(&c.out.join(format!("cache-{i}")));
        for (what, args) in [
            ("explain", vec!["explain", "resourceclaims.spec.devices", "--api-version=resource.k8s.io/v1"]),
            ("apply --dry-run=server", vec!["apply", "--dry-run=server", "-f", claim.as_str()]),
        ] {
            let out = k.run(&args).await?;
            row.requests += 1;
            if !out.ok {
                failed.entry(what).or_default().push(out.stderr.trim().to_string());
            }
        }
    }
    let counts: BTreeMap<&str, usize> = failed.iter().map(|(k, v)| (*k, v.len())).collect();
    row.failures = counts.values().sum();
    row.figure(format!("12 fresh-cache runs each, failures {counts:?}"));
    ensure!(
        failed.is_empty(),
        "kubectl failed through Envoy against the composed OpenAPI: {counts:?}, e.g. {:?}",
        failed.values().flatten().next()
    );
    finish(c, &mut row).await?;
    Ok(row)
}

/// The table Envoy was given, as written.
fn table_json(c: &Cluster) -> Result<Value> {
    let ecds: Value = serde_json::from_slice(&std::fs::read(c.envoy_dir().join("ecds/ecds.json"))?)?;
    let table = skewgate_envoy::table_from_ecds(&ecds).context("ecds.json holds no table")?;
    Ok(serde_json::from_str(table)?)
}

/// The table once it composes legacy discovery: a real apiserver's first legacy walk can fail
/// right after start-up (the sidecar walks again at its next poll), and a table taken before that
/// would differ from every later one for a reason that is not the scenario's.
async fn composed_table(c: &Cluster) -> Result<Value> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let table = table_json(c)?;
        if table.get("legacyDiscovery").and_then(Value::as_array).is_some_and(|d| !d.is_empty()) {
            return Ok(table);
        }
        ensure!(Instant::now() < deadline, "no composed legacy discovery 30 s after start");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The same routing (apiservers, group/versions and who serves each resource), or which parts
/// of it changed. Composed legacy documents are left out: a real apiserver's legacy `/apis` need
/// not list its groups the same way after a restart, and the composed documents follow it.
fn same_routing(before: &Value, after: &Value) -> Result<()> {
    let routing = |t: &Value| json!({"apiservers": t["apiservers"], "groupVersions": t["groupVersions"]});
    let (before, after) = (routing(before), routing(after));
    if before == after {
        return Ok(());
    }
    let mut changed = Vec::new();
    json_changes("", &before, &after, 4, &mut changed);
    bail!("changed: {}", changed.join(", "))
}

fn json_changes(at: &str, old: &Value, new: &Value, depth: usize, out: &mut Vec<String>) {
    match (old, new) {
        _ if old == new => {}
        (Value::Object(a), Value::Object(b)) if depth > 0 => {
            for key in a.keys().chain(b.keys().filter(|k| !a.contains_key(*k))) {
                let (x, y) = (a.get(key).unwrap_or(&Value::Null), b.get(key).unwrap_or(&Value::Null));
                json_changes(&format!("{at}/{key}"), x, y, depth - 1, out);
            }
        }
        _ => out.push(format!("{at}: {} → {}", brief(old), brief(new))),
    }
}

fn brief(v: &Value) -> String {
    let s = v.to_string();
    if s.len() <= 160 {
        s
    } else {
        format!("{}… ({} bytes)", s.chars().take(160).collect::<String>(), s.len())
    }
}
