//! Scenario 5: Peer loss.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use skewgate_testkit::load::{Record, Target};
use skewgate_testkit::scenario::{Row, ids, kubectl, listing, scenario, successes_after};

use crate::support::{
    CLAIMS, ERAS, TIMEOUT, answers_after, finish, load, start, ten_by_servers, ten_targets,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s05_peer_loss() -> Result<()> {
    scenario("05", "peer loss", peer_loss()).await
}

async fn peer_loss() -> Result<Row> {
    let mut row = Row::default();
    // A dead apiserver's GVRs stay in the table until it is back: 503, never 404.
    let mut c = start("s05", ERAS, |_| {}).await?;
    let generation = c.table_on_disk()?.generation().to_string();
    let by = ten_by_servers(&c.table_on_disk()?)?;
    let (c_only, others): (Vec<String>, Vec<String>) = {
        let c_only = by[&ids(&["c"])].clone();
        let others = ten_targets().iter().map(Target::name).filter(|n| !c_only.contains(n)).collect();
        (c_only, others)
    };
    let all_served = by[&ids(&["a", "b", "c"])].clone();
    let load = load(&c, 5, Duration::from_millis(20))?;
    let names: Vec<String> = ten_targets().iter().map(Target::name).collect();
    successes_after(&load, &names, Duration::ZERO, 10, Duration::from_secs(20)).await?;

    let killed = load.now();
    c.kill_apiserver("c").await?;
    let unhealthy_after = c.wait_envoy_sees("c", false, Duration::from_secs(10)).await?;
    // The outage goes on past the health checks' verdict: 30 more answers for each of c's
    // GVRs (about 1.5 s).
    let unhealthy = load.now();
    answers_after(&load, &c_only, unhealthy, 30, Duration::from_secs(20), |r| r.status.is_some()).await?;
    let k = kubectl(&c)?;
    let e = k.fails(&["get", CLAIMS, "-A"]).await?;
    row.requests += 1;
    println!("kubectl during the outage: {}", e.trim());
    assert!(
        e.contains("the server is currently unable to handle the request")
            && e.contains("resourceclaims.v1.resource.k8s.io is served by [c]"),
        "{e}"
    );

    let restarted = load.now();
    c.start_apiserver("c", "1.36").await?;
    successes_after(&load, &c_only, restarted, 20, Duration::from_secs(30)).await?;
    let healthy_after = c.wait_envoy_sees("c", true, Duration::from_secs(10)).await?;
    let report = load.finish().await;
    println!("{}", report.summary());

    // c's GVRs: fine before the kill, 503 Status from the kill until c was back, then fine.
    let mut unexpected: Vec<&Record> = Vec::new();
    let mut outage_503 = 0;
    let mut first_503: Option<Duration> = None;
    let mut recovered: BTreeMap<String, Duration> = BTreeMap::new();
    for name in &c_only {
        let records: Vec<&Record> = report.of(name).collect();
        let back = records
            .iter()
            .filter(|r| r.started > restarted && r.ok())
            .map(|r| r.started)
            .min()
            .context("never back")?;
        recovered.insert(name.clone(), back - restarted);
        for r in records {
            let expected = if r.ended() < killed || r.started >= back {
                r.ok()
            } else if r.in_flight_at(killed) {
                r.ok() || r.is_unavailable_status()
            } else {
                r.is_unavailable_status()
            };
            if !expected {
                unexpected.push(r);
            }
            if r.is_unavailable_status() {
                outage_503 += 1;
                first_503 = Some(
                    first_503
                        .map_or(r.ended() - killed, |f: Duration| f.min(r.ended().saturating_sub(killed))),
                );
            }
        }
    }
    // Everything else: every request succeeded, but for any in flight to c when it died.
    let mut in_flight = 0;
    for name in &others {
        for r in report.of(name) {
            if r.ok() {
                continue;
            }
            if all_served.contains(name) && r.in_flight_at(killed) && r.is_unavailable_status() {
                in_flight += 1;
            } else {
                unexpected.push(r);
            }
        }
    }
    let n = recovered.values().max().copied().unwrap_or_default();
    let first_503 = first_503.unwrap_or_default();
    println!(
        "kill → first 503 Status {first_503:?}, Envoy saw c unhealthy after {unhealthy_after:?}; \
         {outage_503} 503s during the outage; restart → success again after {recovered:?}, Envoy saw it \
         healthy after {healthy_after:?}; \
         {in_flight} in-flight failures; slowest request {:?}",
        report.max_latency()
    );
    row.requests += report.records.len();
    row.failures = unexpected.len();
    ensure!(
        unexpected.is_empty(),
        "{} unexpected outcomes:{}",
        unexpected.len(),
        listing(&report, &unexpected)
    );
    ensure!(outage_503 > 0, "no 503 during the outage");
    // Within the health-check window (2 × 1 s checks), and in fact at once.
    ensure!(first_503 <= Duration::from_secs(3), "first 503 only {first_503:?} after the kill");
    ensure!(n <= Duration::from_secs(10), "c's GVRs back only after {n:?}");
    ensure!(report.max_latency() < TIMEOUT, "a request took {:?}", report.max_latency());
    ensure!(report.records.iter().all(|r| r.status != Some(404)), "a 404");
    // c's GVRs never left the table.
    assert_eq!(c.table_on_disk()?.generation(), generation);
    row.figure(format!(
        "first 503 {:.0}ms after kill, {outage_503}×503 Status, 0×404; N = {:.1}s; in-flight failures \
         {in_flight}; max latency {:.0}ms",
        first_503.as_secs_f64() * 1000.0,
        n.as_secs_f64(),
        report.max_latency().as_secs_f64() * 1000.0
    ));
    finish(c, &mut row).await?;
    Ok(row)
}
