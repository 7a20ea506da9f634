//! Scenario 6: Upgrade in place.

use std::time::Duration;

use anyhow::{Result, ensure};
use skewgate_harness::load::{Record, Target};
use skewgate_harness::scenario::{Row, ids, scenario, serving, successes_after, until};

use crate::support::{CLAIMS, DEVICECLASSES, ERAS, SUITE, finish, start};

/// How long a restarted stand-in's `/readyz` fails in scenario 6 (a real kube-apiserver's
/// post-start hooks take longer still).
const STARTUP: Duration = Duration::from_secs(3);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s06_upgrade_in_place() -> Result<()> {
    scenario("06", "upgrade in place", upgrade_in_place()).await
}

async fn upgrade_in_place() -> Result<Row> {
    let mut row = Row::default();
    let mut c = start("s06", ERAS, |_| {}).await?;
    let first = c.table_on_disk()?.generation().to_string();
    SUITE.ten_by_servers(&c.table_on_disk()?)?;
    let load = SUITE.load(&c, 5, Duration::from_millis(20))?;
    let names: Vec<String> = SUITE.ten_targets().iter().map(Target::name).collect();
    successes_after(&load, &names, Duration::ZERO, 10, Duration::from_secs(20)).await?;

    // A: graceful, the way kube-apiserver restarts: unready and drained first
    // (--shutdown-delay-duration), stopped, back as the 1.36 era, ready once its post-start hooks
    // are done. The sidecar has the new table live before then; drill/tests/drill.rs upgrades
    // apiservers that are ready the instant they start, with a 5 s poll.
    let drain_started = load.now();
    let drained = c.drain_apiserver("b", Duration::from_secs(10)).await?;
    c.stop_apiserver("b").await?;
    c.boot_apiserver("b", "1.36", STARTUP).await?;
    let upgraded = load.now();
    let table = until("the table follows b's upgrade", Duration::from_secs(15), || {
        let t = c.table_on_disk()?;
        Ok((t.generation() != first).then_some(t))
    })
    .await?;
    assert_eq!(serving(&table, CLAIMS), ids(&["b", "c"]));
    assert_eq!(serving(&table, DEVICECLASSES), ids(&["a"]));
    let followed = load.now() - upgraded;
    // Until the table built from b's new discovery is live, b is out of every Envoy cluster,
    // however long that takes: not one request reaches it. How long it takes is a figure of the
    // row (and of `make drill`), not a bound: the debug build on two loaded cores took 1.7–6.3 s
    // for what a quiet machine does in under 2 s.
    let early: Vec<String> = load
        .snapshot()
        .into_iter()
        .filter(|r| {
            r.served_by.as_deref() == Some("b") && r.started >= upgraded && r.started < upgraded + followed
        })
        .map(|r| r.describe(load.targets()))
        .collect();
    ensure!(early.is_empty(), "b served requests before its new table was live: {early:?}");
    c.wait_envoy_sees("b", true, Duration::from_secs(10)).await?;
    // The data path follows too: b serves resourceclaims.
    load.wait_for("b serves resourceclaims", Duration::from_secs(15), |targets, records| {
        let i = targets.iter().position(|t| t.name() == CLAIMS);
        records.iter().any(|r| Some(r.target) == i && r.ok() && r.served_by.as_deref() == Some("b"))
    })
    .await?;
    let phase_a_end = load.now();

    // B: b restarts again without draining (killed, back at once): only requests in flight
    // to it may fail, and only as 503 Status.
    let killed = load.now();
    c.kill_apiserver("b").await?;
    c.start_apiserver("b", "1.36").await?;
    c.wait_envoy_sees("b", true, Duration::from_secs(10)).await?;
    successes_after(&load, &names, load.now(), 10, Duration::from_secs(20)).await?;
    let report = load.finish().await;
    println!("{}", report.summary());

    let phase_a: Vec<&Record> = report.records.iter().filter(|r| r.started < phase_a_end).collect();
    let a_failures: Vec<&Record> = phase_a.iter().copied().filter(|r| !r.ok()).collect();
    let b_failures: Vec<&Record> =
        report.records.iter().filter(|r| r.started >= phase_a_end && !r.ok()).collect();
    let in_flight: Vec<&Record> =
        b_failures.iter().copied().filter(|r| r.in_flight_at(killed) && r.is_unavailable_status()).collect();
    let unexpected: Vec<&Record> = a_failures
        .iter()
        .chain(b_failures.iter().filter(|r| !(r.in_flight_at(killed) && r.is_unavailable_status())))
        .copied()
        .collect();
    let generations_after_a = c.table_on_disk()?.generation().to_string();
    println!(
        "graceful upgrade of b: drained in {drained:?} (from {drain_started:?}), table followed {followed:?} \
         after the restart; {} requests, {} failed. Abrupt restart: {} in flight failed as 503 Status, {} \
         other failures",
        phase_a.len(),
        a_failures.len(),
        in_flight.len(),
        b_failures.len() - in_flight.len()
    );
    row.tally(&report, &unexpected, "failures")?;
    assert_eq!(
        table.generation(),
        generations_after_a,
        "the abrupt restart (same profile) changed the table"
    );
    row.figure(format!(
        "graceful 1.33→1.36 of b: drain {:.1}s, table followed in {:.1}s, 0 failed of {}; abrupt restart: \
         {} in-flight → 503 Status",
        drained.as_secs_f64(),
        followed.as_secs_f64(),
        phase_a.len(),
        in_flight.len()
    ));
    finish(c, &mut row).await?;
    Ok(row)
}
