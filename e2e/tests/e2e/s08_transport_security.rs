//! Scenario 8: Transport security.

use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::Result;
use skewgate_harness::load::{Record, Target};
use skewgate_harness::scenario::{Row, ids, scenario, successes_after};
use skewgate_harness::sidecar;

use crate::support::{SUITE, answers_after, finish, prometheus_value, start};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s08_transport_security() -> Result<()> {
    scenario("08", "transport security", transport_security()).await
}

async fn transport_security() -> Result<Row> {
    let mut row = Row::default();
    // d: a 1.36-era stand-in whose serving certificate comes from a CA nobody trusts.
    let apiservers = [("a", "1.33"), ("b", "1.33"), ("c", "1.36"), ("d", "1.36")];
    // What the edge answers for c's APIs once c turns rogue, at once: with the hold (its own
    // tests are in envoy_filter.rs and clients.rs) each answer would come 10 s later.
    let mut c = start("s08", &apiservers, |o| {
        o.rogue.insert("d".into());
        o.hold = Some(Duration::ZERO);
    })
    .await?;
    let table = c.table_on_disk()?;
    // The sidecar never got d's discovery: d serves nothing in the table.
    assert!(table.gvrs().iter().all(|g| !table.members(g.serving).any(|m| m == "d")));
    let d_report = c
        .until_sidecar_reports("the sidecar reports d", Duration::from_secs(10), |r| {
            sidecar::apiserver(r, "d").cloned()
        })
        .await?;
    assert_eq!(d_report["errorKind"], "tls", "{d_report}");
    assert_eq!(d_report["standing"], "missing", "{d_report}");
    let metrics = c.sidecar_metrics().await?;
    assert!(
        prometheus_value(&metrics, "skewgate_sync_errors_total{apiserver=\"d\",kind=\"tls\"}")
            .is_some_and(|n| n >= 1.0),
        "{metrics}"
    );
    c.wait_envoy_sees("d", false, Duration::from_secs(10)).await?;

    let load = SUITE.load(&c, 4, Duration::from_millis(20))?;
    let names: Vec<String> = SUITE.ten_targets().iter().map(Target::name).collect();
    successes_after(&load, &names, Duration::ZERO, 10, Duration::from_secs(20)).await?;

    // c turns rogue (a botched certificate rotation): drained first, so that nothing is in
    // flight, then back with the rogue CA's certificate.
    let drain_started = load.now();
    c.drain_apiserver("c", Duration::from_secs(10)).await?;
    c.stop_apiserver("c").await?;
    c.start_rogue_apiserver("c", "1.36").await?;
    let switched = load.now();
    let by = SUITE.ten_by_servers(&c.table_on_disk()?)?;
    let c_only = by[&ids(&["c"])].clone();
    answers_after(&load, &c_only, switched, 30, Duration::from_secs(20), Record::is_unavailable_status)
        .await?;
    let report_c = c
        .until_sidecar_reports("the sidecar reports c's TLS failure", Duration::from_secs(10), |r| {
            sidecar::apiserver(r, "c").filter(|a| a["errorKind"] == "tls").cloned()
        })
        .await?;
    assert_eq!(report_c["standing"], "stale", "{report_c}");
    let metrics = c.sidecar_metrics().await?;
    assert!(
        prometheus_value(&metrics, "skewgate_sync_errors_total{apiserver=\"c\",kind=\"tls\"}")
            .is_some_and(|n| n >= 1.0),
        "{metrics}"
    );
    let report = load.finish().await;
    println!("{}", report.summary());

    // Nobody ever got an HTTP request through to a rogue stand-in; both refused handshakes.
    let d = c.standin("d")?;
    let rogue_c = c.standin("c")?;
    let (d_requests, c_requests) =
        (d.requests.load(Ordering::SeqCst), rogue_c.requests.load(Ordering::SeqCst));
    let (d_refused, c_refused) = (
        d.tls_handshake_failures.load(Ordering::SeqCst),
        rogue_c.tls_handshake_failures.load(Ordering::SeqCst),
    );
    assert_eq!((d_requests, c_requests), (0, 0), "a rogue stand-in served requests");
    assert!(d_refused > 0 && c_refused > 0, "handshakes refused: d {d_refused}, c {c_refused}");
    let mut unexpected: Vec<&Record> = Vec::new();
    let mut rogue_503 = 0;
    for r in &report.records {
        let name = report.targets[r.target].name();
        assert_ne!(r.served_by.as_deref(), Some("d"));
        if c_only.contains(&name) && r.started > switched {
            if r.is_unavailable_status() {
                rogue_503 += 1;
            } else {
                unexpected.push(r);
            }
        } else if !(r.ok()
            || (c_only.contains(&name) && r.ended() >= drain_started && r.is_unavailable_status()))
        {
            // c's GVRs are unavailable from its drain on (it is their only server).
            unexpected.push(r);
        }
    }
    row.tally(&report, &unexpected, "outcomes")?;
    row.figure(format!(
        "rogue d: 0 requests, {d_refused} refused handshakes, sidecar tls error; rogue c: {rogue_503}×503 \
         Status for its GVRs, 0 requests, {c_refused} refused handshakes, sidecar tls error (stale)"
    ));
    finish(c, &mut row).await?;
    Ok(row)
}
