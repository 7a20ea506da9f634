//! Skew below the GVR through a real Envoy 1.40 running the built filter and the sidecar, on the
//! local 1.33/1.33/1.36 cluster of stand-ins: the 1.33 ones, as kube-apiserver 1.33 by default,
//! refuse a streaming list (a watch with `sendInitialEvents`) with 422, and say so in their
//! `/metrics`; the sidecar reads that, and the edge sends streaming lists only to c.
//! `e2e_real.rs` (R13) does the same on real kube-apiservers.
//!
//! Needs `make wasm` and `make setup` (Envoy in .venv): fails, never skips.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use serde_json::Value;
use skewgate_testkit::cluster::{self, Credentials, Options};
use skewgate_testkit::echo::SERVED_BY;
use skewgate_testkit::paths;

const TIMEOUT: Duration = Duration::from_secs(10);
const ERAS: &[(&str, &str)] = &[("a", "1.33"), ("b", "1.33"), ("c", "1.36")];
const STREAMING_LIST: &str = "/api/v1/namespaces/default/configmaps?watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true&timeoutSeconds=1";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_lists_go_only_where_watch_list_is_on() -> Result<()> {
    paths::envoy_binary()?;
    paths::filter_wasm()?;
    let out =
        Path::new(env!("CARGO_TARGET_TMPDIR")).join("feature-skew").join(std::process::id().to_string());
    let _ = std::fs::remove_dir_all(&out);
    let c = cluster::start(&Options::ephemeral(&out, ERAS)).await.context("starting the cluster")?;

    // The table the sidecar pushed says who has the feature.
    let table: Value = serde_json::from_slice(&std::fs::read(c.out.join("envoy/ecds/ecds.json"))?)
        .ok()
        .and_then(|ecds| skewgate_envoy::table_from_ecds(&ecds).map(str::to_owned))
        .map(|t| serde_json::from_str(&t))
        .transpose()?
        .context("no table in Envoy's ECDS file")?;
    let gates: BTreeMap<&str, &Value> = table["apiservers"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|a| (a["id"].as_str().unwrap_or_default(), &a["features"]["WatchList"]))
        .collect();
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
    c.shutdown().await
}
