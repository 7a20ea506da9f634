//! Scenario 1: Rerouting.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use skewgate_harness::cluster::Credentials;
use skewgate_harness::echo::SERVED_BY;
use skewgate_harness::kubectl::{self, Kubectl};
use skewgate_harness::scenario::{Row, header, ids, kubectl, scenario, serving};

use crate::support::{CLAIMS, DEVICECLASSES, ERAS, TIMEOUT, finish, rerouted_count, start};

/// `runs` × `kubectl get <gvr> -A -v=8`, two at a time; who served each (from the response
/// headers kubectl logs).
async fn kubectl_gets(k: &Kubectl, gvr: &str, runs: usize) -> Result<BTreeMap<String, usize>> {
    let resource = gvr.split('.').next().unwrap_or(gvr).to_string();
    let next = Arc::new(AtomicUsize::new(0));
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..2 {
        let (k, next, gvr, resource) = (k.clone(), next.clone(), gvr.to_string(), resource.clone());
        workers.spawn(async move {
            let mut by: Vec<String> = Vec::new();
            while next.fetch_add(1, Ordering::SeqCst) < runs {
                let out = k.run(&["get", &gvr, "-A", "-v=8", "--request-timeout=20s"]).await?;
                let lists: Vec<kubectl::Exchange> = kubectl::exchanges(&out.stderr)
                    .into_iter()
                    .filter(|e| e.url.split('?').next().is_some_and(|p| p.ends_with(&format!("/{resource}"))))
                    .collect();
                if !out.ok || lists.len() != 1 || lists[0].status != 200 {
                    bail!("kubectl get {gvr} -A: ok={} exchanges {lists:?}\n{}", out.ok, out.stderr);
                }
                by.push(lists[0].header(SERVED_BY).context("no x-skewgate-served-by")?.to_string());
            }
            Ok::<_, anyhow::Error>(by)
        });
    }
    let mut by = BTreeMap::new();
    while let Some(done) = workers.join_next().await {
        for id in done?? {
            *by.entry(id).or_default() += 1;
        }
    }
    Ok(by)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s01_rerouting() -> Result<()> {
    scenario("01", "rerouting", rerouting()).await
}

async fn rerouting() -> Result<Row> {
    let mut row = Row::default();
    let c = start("s01", ERAS, |_| {}).await?;
    let k = kubectl(&c)?;
    let envoy = c.envoy()?;
    // One discovery round fills kubectl's cache: each run below then makes one request.
    k.ok(&["api-resources", "-o", "name"]).await?;
    row.requests += 1;
    let table = c.table_on_disk()?;
    assert_eq!(serving(&table, CLAIMS), ids(&["c"]));
    assert_eq!(serving(&table, DEVICECLASSES), ids(&["a", "b"]));
    assert_eq!(serving(&table, "pods.v1"), ids(&["a", "b", "c"]));
    // Nothing has asked for these GVRs yet (the launcher and api-resources read health and
    // discovery only); a count still in flight would only make the totals below too high.
    let claims_before = rerouted_count(envoy, "resource.k8s.io", "v1", "resourceclaims").await?;
    let classes_before = rerouted_count(envoy, "resource.k8s.io", "v1alpha3", "deviceclasses").await?;

    for (gvr, runs) in [(CLAIMS, 200), (DEVICECLASSES, 200), ("pods", 60)] {
        let started = Instant::now();
        let by = kubectl_gets(&k, gvr, runs).await?;
        let took = started.elapsed();
        row.requests += runs;
        let gvr_name = if gvr == "pods" { "pods.v1" } else { gvr };
        let expected: BTreeSet<String> = serving(&table, gvr_name).into_iter().collect();
        let seen: BTreeSet<String> = by.keys().cloned().collect();
        println!(
            "kubectl get {gvr} ×{runs} in {took:.1?} ({:.0?}/run, 2 at a time): served by {by:?}",
            took / runs as u32
        );
        assert_eq!(by.values().sum::<usize>(), runs, "{gvr}");
        // Every run went to a server that serves it, and (several servers) spread over all.
        assert_eq!(seen, expected, "{gvr}: served by {by:?}");
        row.figure(format!("{gvr} ×{runs} → {by:?}"));
    }
    // The filter counted exactly the kubectl lists as rerouted.
    // The filter hands its per-GVR counts to Envoy once a second.
    let deadline = Instant::now() + Duration::from_secs(5);
    while rerouted_count(envoy, "resource.k8s.io", "v1", "resourceclaims").await? - claims_before < 200
        && Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let claims = rerouted_count(envoy, "resource.k8s.io", "v1", "resourceclaims").await? - claims_before;
    let classes =
        rerouted_count(envoy, "resource.k8s.io", "v1alpha3", "deviceclasses").await? - classes_before;
    assert_eq!((claims, classes), (200, 200), "skewgate_rerouted_requests_total");

    // The spread of GVRs everybody serves, on a sample big enough to judge it.
    let client = c.client(Credentials::Alice, TIMEOUT)?;
    let base = c.envoy_url()?;
    let mut spread: BTreeMap<String, usize> = BTreeMap::new();
    let paths = [
        "/api/v1/pods",
        "/api/v1/namespaces/default/configmaps",
        "/apis/apps/v1/deployments",
        "/api/v1/namespaces",
    ];
    for i in 0..600 {
        let r = client
            .get(format!("{base}{}", paths[i % paths.len()]))
            .header("accept", "application/json")
            .send()
            .await?;
        ensure!(r.status() == 200, "{}: {}", paths[i % paths.len()], r.status());
        *spread.entry(header(r.headers(), SERVED_BY).unwrap_or_default()).or_default() += 1;
    }
    row.requests += 600;
    println!("600 lists of GVRs all serve: {spread:?}");
    assert_eq!(spread.keys().cloned().collect::<Vec<_>>(), ids(&["a", "b", "c"]));
    // RANDOM load balancing: each of three gets about a third; 20% is 7 standard deviations off.
    assert!(spread.values().all(|n| *n >= 120), "uneven spread: {spread:?}");
    row.figure(format!("all-served ×600 → {spread:?}"));
    finish(c, &mut row).await?;
    Ok(row)
}
