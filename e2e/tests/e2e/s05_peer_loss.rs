//! Scenario 5: Peer loss.

use std::time::Duration;

use anyhow::{Result, ensure};
use skewgate_harness::scenario::{Row, scenario};

use crate::common::peer_loss::Outcomes;
use crate::support::{ERAS, SUITE, TIMEOUT, finish, start};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s05_peer_loss() -> Result<()> {
    scenario("05", "peer loss", peer_loss()).await
}

async fn peer_loss() -> Result<Row> {
    let mut row = Row::default();
    // A dead apiserver's GVRs stay in the table until it is back: 503, never 404.
    // What the edge answers while c is away, at once: with the hold (its own tests are in
    // envoy_filter.rs and clients.rs) each answer would come 10 s later.
    let mut c = start("s05", ERAS, |o| o.hold = Some(Duration::ZERO)).await?;
    let generation = c.table_on_disk()?.generation().to_string();
    let outage = SUITE.peer_loss(&mut c, &mut row, Duration::from_secs(20), Duration::from_secs(30)).await?;
    let e = &outage.kubectl_error;
    // The filter's 503 names the GVR and its servers; Envoy's on the set's bypass route (kubectl's
    // connection mapped already), the set's servers and cluster.
    assert!(
        e.contains("the server is currently unable to handle the request")
            && (e.contains("resourceclaims.v1.resource.k8s.io is served by [c]")
                || e.contains(
                    "no apiserver of [c] answered (cluster skewgate-set-c; route bypass-certificate/skewgate-set-c;"
                )),
        "{e}"
    );
    let report = &outage.report;
    // Only what was under way to c when it died may have failed otherwise.
    let outcomes = outage.outcomes(|r, killed| r.in_flight_at(killed) && r.is_unavailable_status())?;
    let Outcomes { outage_503, in_flight, recovered, .. } = &outcomes;
    let (unhealthy_after, healthy_after) = (outage.unhealthy_after, outage.healthy_after);
    let n = outcomes.back_after();
    let first_503 = outcomes.first_503.unwrap_or_default();
    println!(
        "kill → first 503 Status {first_503:?}, Envoy saw c unhealthy after {unhealthy_after:?}; \
         {outage_503} 503s during the outage; restart → success again after {recovered:?}, Envoy saw it \
         healthy after {healthy_after:?}; \
         {in_flight} in-flight failures; slowest request {:?}",
        report.max_latency()
    );
    outcomes.check(&mut row, report)?;
    // Within the health-check window (2 × 1 s checks), and in fact at once.
    ensure!(first_503 <= Duration::from_secs(3), "first 503 only {first_503:?} after the kill");
    ensure!(n <= Duration::from_secs(10), "c's GVRs back only after {n:?}");
    ensure!(report.max_latency() < TIMEOUT, "a request took {:?}", report.max_latency());
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
