//! End-to-end, apiservers from the cluster (`[cluster] members = "endpointSlice"`): the local
//! skewed cluster (Envoy with the built filter, the sidecar, stand-ins a and b of the 1.33 era
//! and c of the 1.36 era sharing one store), each stand-in publishing itself in the
//! `kubernetes` EndpointSlices and an identity Lease, as kube-apiserver does. Like `e2e/`:
//! one cluster per scenario, one `E2E-ROW` summary line each (written to
//! `SKEWGATE_E2E_SUMMARY` when set). Needs `make wasm` and `make setup`: fails, never skips.
//!
//! Times are measured and printed, never asserted.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use serde_json::{Value, json};
use skewgate_core::table::{RoutingTable, Serving};
use skewgate_harness::cluster::{self, Cluster, Credentials, Options};
use skewgate_harness::load::{Load, Record, Settings, Target};
use skewgate_harness::paths;
use skewgate_harness::scenario::{Row, fresh_dir, listing, scenario, ten_targets, until};
use skewgate_harness::sidecar;

const ERAS: &[(&str, &str)] = &[("a", "1.33"), ("b", "1.33"), ("c", "1.36")];
const TIMEOUT: Duration = Duration::from_secs(10);
const V2: &str = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json";
const CRD_GROUP: &str = "stable.example.com";

async fn start(name: &str) -> Result<Cluster> {
    start_with(name, false).await
}

async fn start_with(name: &str, leases: bool) -> Result<Cluster> {
    paths::envoy_binary()?;
    paths::filter_wasm()?;
    let out = fresh_dir(Path::new(env!("CARGO_TARGET_TMPDIR")), "e2e", name);
    let mut options = Options::ephemeral(&out, ERAS);
    options.from_cluster = true;
    options.from_leases = leases;
    cluster::start(&options).await.with_context(|| format!("starting cluster {name}"))
}

async fn finish(c: Cluster) -> Result<()> {
    let plaintext = c.plaintext_attempts();
    ensure!(plaintext == 0, "{plaintext} plaintext connections reached a stand-in");
    let out = c.out.clone();
    c.shutdown().await?;
    let _ = std::fs::remove_dir_all(out);
    Ok(())
}

fn load(c: &Cluster, targets: Vec<Target>, workers: usize) -> Result<Load> {
    let client = c.client(Credentials::Alice, TIMEOUT)?;
    let settings = Settings { workers, pause: Duration::from_millis(20), timeout: TIMEOUT };
    Ok(Load::start(&client, &c.envoy_url()?, targets, settings))
}

fn ids(table: &RoutingTable) -> Vec<String> {
    table.apiservers().iter().map(|a| a.id.clone()).collect()
}

fn serving(table: &RoutingTable, group: &str, version: &str, resource: &str) -> Option<Vec<String>> {
    let gvr = table.gvr(group, version, resource)?;
    Some(table.members(gvr.serving).map(str::to_owned).collect())
}

// ---------------------------------------------------------------------------------------------
// 12. An apiserver joins, then leaves

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s12_join_and_leave() -> Result<()> {
    scenario("12", "peers join and leave", join_and_leave(false)).await
}

/// The same through the identity Leases (`members = "leases"`): d's id is its lease name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s14_join_and_leave_by_leases() -> Result<()> {
    scenario("14", "peers join/leave (Leases)", join_and_leave(true)).await
}

async fn join_and_leave(leases: bool) -> Result<Row> {
    let mut row = Row::default();
    let mut c = start_with(if leases { "s14" } else { "s12" }, leases).await?;
    ensure!(ids(&c.table_on_disk()?) == ["a", "b", "c"], "the first table: {:?}", ids(&c.table_on_disk()?));
    let load = load(&c, ten_targets("v1alpha3"), 5)?;
    load.wait_for("10 successes each", Duration::from_secs(20), |targets, records| {
        (0..targets.len()).all(|t| records.iter().filter(|r| r.target == t && r.ok()).count() >= 10)
    })
    .await?;

    // d: a second 1.36-era apiserver, known to the sidecar only through the EndpointSlice.
    let added = load.now();
    let added_at = Instant::now();
    c.add_apiserver("d", "1.36").await?;
    // The sidecar's id for d: the endpoint's hostname, or the lease name.
    let d = if leases { c.standin("d")?.lease_name() } else { "d".to_string() };
    let in_table = until("d in the table on disk", Duration::from_secs(30), || {
        Ok(ids(&c.table_on_disk()?).contains(&d).then(|| added_at.elapsed()))
    })
    .await?;
    let claims = serving(&c.table_on_disk()?, "resource.k8s.io", "v1", "resourceclaims");
    ensure!(claims == Some(vec!["c".into(), d.clone()]), "resourceclaims served by {claims:?}");
    load.wait_for("requests served by d", Duration::from_secs(30), |_, records| {
        records.iter().any(|r| r.started > added && r.served_by.as_deref() == Some("d"))
    })
    .await?;
    let first_by_d = load
        .snapshot()
        .iter()
        .filter(|r| r.started > added && r.served_by.as_deref() == Some("d"))
        .map(|r| r.started - added)
        .min()
        .unwrap_or_default();
    let report = c.sidecar_status().await?;
    let report_source = report
        .as_ref()
        .and_then(|r| sidecar::apiserver(r, &d))
        .and_then(|a| a["source"].as_str().map(str::to_owned));
    let expected = if leases { "Lease" } else { "EndpointSlice" };
    ensure!(report_source.as_deref() == Some(expected), "d's source: {report_source:?}");
    // d serves every one of its GVRs for a while before it goes.
    let joined = load.now();
    load.wait_for("20 answers from d after it joined", Duration::from_secs(30), |_, records| {
        records.iter().filter(|r| r.started > joined && r.served_by.as_deref() == Some("d")).count() >= 20
    })
    .await?;

    let removed = load.now();
    let removed_at = Instant::now();
    c.stop_apiserver("d").await?;
    let stopped = load.now();
    let out_of_table = until("d out of the table on disk", Duration::from_secs(30), || {
        Ok((!ids(&c.table_on_disk()?).contains(&d)).then(|| removed_at.elapsed()))
    })
    .await?;
    let claims = serving(&c.table_on_disk()?, "resource.k8s.io", "v1", "resourceclaims");
    ensure!(claims == Some(vec!["c".into()]), "resourceclaims served by {claims:?} after d left");
    let left = load.now();
    load.wait_for("10 more successes each after d left", Duration::from_secs(30), |targets, records| {
        (0..targets.len())
            .all(|t| records.iter().filter(|r| r.target == t && r.ok() && r.started > left).count() >= 10)
    })
    .await?;
    let report = load.finish().await;
    println!("{}", report.summary());

    // Every request succeeded, but any under way to d while it stopped.
    let mut in_flight = 0;
    let mut unexpected: Vec<&Record> = Vec::new();
    for r in report.records.iter().filter(|r| !r.ok()) {
        let during_stop = r.started <= stopped && r.ended() >= removed;
        if during_stop && r.is_unavailable_status() {
            in_flight += 1;
        } else {
            unexpected.push(r);
        }
    }
    let after_d =
        report.records.iter().filter(|r| r.started > stopped && r.served_by.as_deref() == Some("d")).count();
    println!(
        "join: d in the table {in_table:?} after it published itself, first request served by d {first_by_d:?} \
         after; leave: d out of the table {out_of_table:?} after its graceful stop began; \
         {} requests, {} failed ({in_flight} under way while d stopped), {after_d} served by d after it stopped",
        report.records.len(),
        unexpected.len() + in_flight,
    );
    row.tally(&report, &unexpected, "failures")?;
    ensure!(after_d == 0, "{after_d} requests served by d after it stopped");
    row.figure(format!(
        "join: in table {:.2}s, first request to d {:.2}s; leave: out of table {:.2}s; {in_flight} in-flight failures",
        in_table.as_secs_f64(),
        first_by_d.as_secs_f64(),
        out_of_table.as_secs_f64()
    ));
    finish(c).await?;
    Ok(row)
}

// ---------------------------------------------------------------------------------------------
// 13. A CRD created while one apiserver's discovery lags

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s13_crd_with_lagging_discovery() -> Result<()> {
    scenario("13", "CRD, one discovery 5 s behind", crd_with_lagging_discovery()).await
}

async fn lists_group(client: &reqwest::Client, url: &str) -> Result<bool> {
    let doc: Value = client.get(url).header("accept", V2).send().await?.error_for_status()?.json().await?;
    Ok(doc["items"].as_array().into_iter().flatten().any(|g| g["metadata"]["name"] == CRD_GROUP))
}

async fn crd_with_lagging_discovery() -> Result<Row> {
    let mut row = Row::default();
    let c = start("s13").await?;
    let lag = Duration::from_secs(5);
    c.standin("b")?.set_discovery_lag(lag);
    let admin = c.client(Credentials::AdminToken, TIMEOUT)?;
    let direct = c.direct_client(TIMEOUT)?;
    let envoy = c.envoy_url()?;
    let crd = json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("widgets.{CRD_GROUP}")},
        "spec": {
            "group": CRD_GROUP,
            "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "listKind": "WidgetList"},
            "versions": [{"name": "v1", "served": true, "storage": true,
                          "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}],
        },
    });
    let created_at = Instant::now();
    let response = admin
        .post(format!("{envoy}/apis/apiextensions.k8s.io/v1/customresourcedefinitions"))
        .json(&crd)
        .send()
        .await?;
    ensure!(response.status() == 201, "creating the CRD: {} {}", response.status(), response.text().await?);
    let widgets = Target::list(CRD_GROUP, "v1", "widgets", Some("default"));
    let load = load(&c, vec![widgets.clone(), Target::list("", "v1", "pods", Some("default"))], 4)?;

    // Until b's discovery shows the CRD (and a while after), every table Envoy gets sends it to
    // the pool or does not know it (the pool too): never a subset.
    let mut tables = BTreeSet::new();
    // (generation, members) of every table seen sending it to a subset, and how often one was.
    let mut subsets = BTreeSet::new();
    let mut subsets_seen = 0;
    let (a_url, b_url) = (c.apiserver_url("a")?, c.apiserver_url("b")?);
    let mut a_shows = None;
    let mut b_shows = None;
    let mut extension_in_table = None;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let table = c.table_on_disk()?;
        if let Some(gvr) = table.gvr(CRD_GROUP, "v1", "widgets") {
            if gvr.serving != Serving::All {
                subsets_seen += 1;
                let members: Vec<String> = table.members(gvr.serving).map(str::to_owned).collect();
                subsets.insert((table.generation().to_string(), members));
            } else {
                extension_in_table.get_or_insert(created_at.elapsed());
            }
        }
        tables.insert(table.generation().to_string());
        if a_shows.is_none() && lists_group(&direct, &format!("{a_url}/apis")).await? {
            a_shows = Some(created_at.elapsed());
        }
        if b_shows.is_none() && lists_group(&direct, &format!("{b_url}/apis")).await? {
            b_shows = Some(created_at.elapsed());
        }
        if b_shows.is_some() && extension_in_table.is_some() {
            break;
        }
        ensure!(Instant::now() < deadline, "b's discovery never showed the CRD, or the table never had it");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The merged /apis the filter serves lists the CRD.
    ensure!(lists_group(&admin, &format!("{envoy}/apis")).await?, "the merged /apis lacks {CRD_GROUP}");
    let settled = load.now();
    load.wait_for("20 widget lists after b caught up", Duration::from_secs(20), |_, records| {
        records.iter().filter(|r| r.target == 0 && r.started > settled).count() >= 20
    })
    .await?;
    let report = load.finish().await;
    println!("{}", report.summary());
    // The filter counts, per GVR, every request it sends to a set rather than the pool (the
    // bypass routes send reads to a set only for a table that has the GVR in one: `subsets`).
    let rerouted: u64 = c
        .envoy()?
        .stats()
        .await?
        .iter()
        .filter(|(k, _)| k.contains("rerouted_requests_total") && k.contains(&format!("group={CRD_GROUP};")))
        .map(|(_, v)| *v)
        .sum();
    let failed: Vec<&Record> = report.records.iter().filter(|r| !r.ok()).collect();
    let lag_window = b_shows.unwrap_or_default();
    let by_b_during_lag = report
        .of(&widgets.name())
        .filter(|r| r.ended() < lag_window && r.served_by.as_deref() == Some("b"))
        .count();
    println!(
        "CRD created; a's discovery showed it after {a_shows:?}, b's (lag {lag:?}) after {b_shows:?}; the \
         table first routed it (to the pool) after {extension_in_table:?}; {} tables seen, {} with a subset \
         ({subsets:?}, seen {subsets_seen} times); {rerouted} widget requests rerouted to a set; {} requests, {} failed, {} 404; {by_b_during_lag} \
         widget lists served by b while its discovery lagged",
        tables.len(),
        subsets.len(),
        report.records.len(),
        failed.len(),
        report.records.iter().filter(|r| r.status == Some(404)).count(),
    );
    row.requests = report.records.len() + 1;
    row.failures = failed.len() + subsets.len();
    ensure!(subsets.is_empty(), "the CRD was routed to a subset: {subsets:?}");
    ensure!(rerouted == 0, "{rerouted} widget requests were routed to a set");
    ensure!(failed.is_empty(), "{} failed requests:{}", failed.len(), listing(&report, &failed));
    ensure!(by_b_during_lag > 0, "b served no widget list while its discovery lagged: not the pool?");
    row.figure(format!(
        "b's discovery {:.1}s behind; table had it (pool) at {:.2}s; 0 subsets, 0 rerouted, 0×404; \
         {by_b_during_lag} lists by b during the lag",
        lag_window.as_secs_f64(),
        extension_in_table.unwrap_or_default().as_secs_f64()
    ));
    finish(c).await?;
    Ok(row)
}
