//! Skew below the GVR through a real Envoy 1.40 running the built filter and the sidecar, on the
//! local 1.33/1.33/1.36 cluster of stand-ins: the 1.33 ones, as kube-apiserver 1.33 by default,
//! refuse a streaming list (a watch with `sendInitialEvents`) with 422, and say so in their
//! `/metrics`; the sidecar reads that, and the edge sends streaming lists only to c. They also
//! drop a claim's `spec.volumeAttributesClassName` (VolumeAttributesClass off, 1.33's default):
//! the edge sends a write that sets it only to c, so none is lost.
//! `e2e_real.rs` (R13, R16) does the same on real kube-apiservers.
//!
//! Needs `make wasm` and `make setup` (Envoy in .venv): fails, never skips.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use serde_json::Value;
use skewgate_harness::cluster::{self, Credentials, Options};
use skewgate_harness::echo::SERVED_BY;
use skewgate_harness::paths;
use skewgate_harness::scenario::{class_patch, volume_claim};

const TIMEOUT: Duration = Duration::from_secs(10);
const ERAS: &[(&str, &str)] = &[("a", "1.33"), ("b", "1.33"), ("c", "1.36")];
const STREAMING_LIST: &str = "/api/v1/namespaces/default/configmaps?watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true&timeoutSeconds=1";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn features_go_only_where_they_are_on() -> Result<()> {
    paths::envoy_binary()?;
    paths::filter_wasm()?;
    let out =
        Path::new(env!("CARGO_TARGET_TMPDIR")).join("feature-skew").join(std::process::id().to_string());
    let _ = std::fs::remove_dir_all(&out);
    let c = cluster::start(&Options::ephemeral(&out, ERAS)).await.context("starting the cluster")?;
    streaming_lists(&c).await.context("streaming lists")?;
    gated_fields(&c).await.context("gated fields")?;
    c.shutdown().await
}

/// The gate's state per apiserver, in the table the sidecar pushed to Envoy.
fn gates_in_table<'t>(table: &'t Value, gate: &str) -> BTreeMap<&'t str, &'t Value> {
    table["apiservers"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|a| (a["id"].as_str().unwrap_or_default(), &a["features"][gate]))
        .collect()
}

fn pushed_table(c: &cluster::Cluster) -> Result<Value> {
    serde_json::from_slice::<Value>(&std::fs::read(c.out.join("envoy/ecds/ecds.json"))?)
        .ok()
        .and_then(|ecds| skewgate_envoy::table_from_ecds(&ecds).map(str::to_owned))
        .map(|t| serde_json::from_str(&t))
        .transpose()?
        .context("no table in Envoy's ECDS file")
}

const CLAIMS: &str = "/api/v1/namespaces/default/persistentvolumeclaims";

/// Claims that set `spec.volumeAttributesClassName`, created and patched through the edge: all
/// reach c and keep it; those that do not set it go to any apiserver. Straight to a 1.33
/// stand-in, the field is dropped: what a plain load balancer loses two times in three.
async fn gated_fields(c: &cluster::Cluster) -> Result<()> {
    let table = pushed_table(c)?;
    let (off, on) = (Value::Bool(false), Value::Bool(true));
    let gates = gates_in_table(&table, "VolumeAttributesClass");
    ensure!(
        gates == BTreeMap::from([("a", &off), ("b", &off), ("c", &on)]),
        "VolumeAttributesClass: {gates:?}"
    );

    let direct = c.direct_client(TIMEOUT)?;
    let url = format!("{}{CLAIMS}", c.apiserver_url("a")?);
    let stored: Value =
        direct.post(&url).json(&volume_claim("straight-to-a", Some("gold"))).send().await?.json().await?;
    ensure!(stored["spec"].get("volumeAttributesClassName").is_none(), "a 1.33 stand-in kept it: {stored}");

    let client = c.client(Credentials::AdminToken, TIMEOUT)?;
    let base = format!("{}{CLAIMS}", c.envoy_url()?);
    let (mut with, mut without) = (BTreeMap::new(), BTreeMap::new());
    for i in 0..24 {
        let class = (i % 2 == 0).then_some("gold");
        let r = client.post(&base).json(&volume_claim(&format!("claim-{i}"), class)).send().await?;
        let by = r.headers().get(SERVED_BY).and_then(|v| v.to_str().ok()).unwrap_or("(none)").to_owned();
        ensure!(r.status() == 201, "claim-{i}: {} from {by}", r.status());
        *(if class.is_some() { &mut with } else { &mut without }).entry(by).or_insert(0) += 1;
    }
    ensure!(with == BTreeMap::from([("c".to_owned(), 12)]), "claims with the field created by {with:?}");
    ensure!(without.len() > 1, "claims without it all went to {without:?}");
    // The claims without it get it by a merge patch and by a JSON patch.
    for i in (1..24).step_by(2) {
        let (content_type, body) = class_patch(i / 2);
        let r = client
            .patch(format!("{base}/claim-{i}"))
            .header("content-type", content_type)
            .body(body)
            .send()
            .await?;
        let by = r.headers().get(SERVED_BY).and_then(|v| v.to_str().ok()).unwrap_or("(none)").to_owned();
        ensure!(
            r.status() == 200 && by == "c",
            "patch of claim-{i} ({content_type}): {} from {by}",
            r.status()
        );
    }
    // Envoy counts them: the 24 writes that set the class, none that did not read.
    let prometheus = c.envoy()?.prometheus().await?;
    let gated: Vec<&str> =
        prometheus.lines().filter(|l| l.starts_with("skewgate_gated_writes_total")).collect();
    ensure!(
        gated.contains(&"skewgate_gated_writes_total{outcome=\"narrowed\"} 24")
            && gated.contains(&"skewgate_gated_writes_total{outcome=\"as_routed\"} 12")
            && !gated.iter().any(|l| l.contains("unread") && !l.ends_with(" 0")),
        "Envoy's counts: {gated:?}"
    );
    for i in 0..24 {
        let stored: Value = client.get(format!("{base}/claim-{i}")).send().await?.json().await?;
        let want = if i % 2 == 0 { "gold" } else { "silver" };
        ensure!(stored["spec"]["volumeAttributesClassName"] == want, "claim-{i} as stored: {stored}");
    }
    Ok(())
}

/// Streaming lists through the edge, from a token and a certificate client: only to c.
async fn streaming_lists(c: &cluster::Cluster) -> Result<()> {
    // The table the sidecar pushed says who has the feature.
    let table = pushed_table(c)?;
    let gates = gates_in_table(&table, "WatchList");
    let (off, on) = (Value::Bool(false), Value::Bool(true));
    ensure!(
        gates == BTreeMap::from([("a", &off), ("b", &off), ("c", &on)]),
        "WatchList in the table: {gates:?}"
    );

    // Straight to a 1.33 stand-in: refused, as kube-apiserver 1.33 refuses it.
    let direct = c.direct_client(TIMEOUT)?;
    let r = direct.get(format!("{}{STREAMING_LIST}", c.apiserver_url("a")?)).send().await?;
    ensure!(r.status() == 422, "straight to a: {}", r.status());

    // Through the edge, from a token client and from a certificate client: c, every time. A
    // plain watch still goes to any apiserver. Side by side: each watch lasts its second.
    let base = c.envoy_url()?;
    let mut requests = tokio::task::JoinSet::new();
    for (who, path, n) in [
        (Credentials::AdminToken, STREAMING_LIST, 15),
        (Credentials::Alice, STREAMING_LIST, 15),
        (Credentials::AdminToken, "/api/v1/namespaces/default/configmaps?watch=1&timeoutSeconds=1", 30),
    ] {
        let client = c.client(who, TIMEOUT)?;
        for _ in 0..n {
            let (client, url) = (client.clone(), format!("{base}{path}"));
            requests.spawn(async move {
                let r = client.get(&url).send().await?;
                let status = r.status().as_u16();
                let by =
                    r.headers().get(SERVED_BY).and_then(|v| v.to_str().ok()).unwrap_or("(none)").to_owned();
                r.bytes().await?;
                anyhow::Ok((url.contains("sendInitialEvents"), status, by))
            });
        }
    }
    let (mut streaming, mut plain) = (BTreeMap::new(), BTreeMap::new());
    while let Some(done) = requests.join_next().await {
        let (is_streaming, status, by) = done??;
        ensure!(status == 200, "through the edge: {status} from {by}");
        *(if is_streaming { &mut streaming } else { &mut plain }).entry(by).or_insert(0) += 1;
    }
    ensure!(streaming == BTreeMap::from([("c".to_owned(), 30)]), "streaming lists served by {streaming:?}");
    ensure!(plain.len() > 1, "plain watches all went to {plain:?}");
    Ok(())
}
