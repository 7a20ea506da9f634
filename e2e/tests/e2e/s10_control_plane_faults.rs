//! Scenario 10: Control-plane faults.

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use serde_json::{Value, json};
use skewgate_harness::load::Target;
use skewgate_harness::scenario::{Row, listing, scenario, successes_after, until};

use crate::support::{ERAS, SUITE, finish, prometheus_value, start};

fn stamp(path: &Path) -> Result<(u64, i64, i64)> {
    let m = std::fs::metadata(path)?;
    Ok((m.ino(), m.mtime(), m.mtime_nsec()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s10_control_plane_faults() -> Result<()> {
    scenario("10", "control-plane faults", control_plane_faults()).await
}

async fn control_plane_faults() -> Result<Row> {
    let mut row = Row::default();
    let mut c = start("s10", ERAS, |_| {}).await?;
    let ecds = c.envoy_dir().join("ecds/ecds.json");
    let cds = c.envoy_dir().join("cds/cds.json");
    let by = SUITE.ten_by_servers(&c.table_on_disk()?)?;
    let generation = c.table_on_disk()?.generation().to_string();
    let load = SUITE.load(&c, 3, Duration::from_millis(20))?;
    let names: Vec<String> = SUITE.ten_targets().iter().map(Target::name).collect();
    successes_after(&load, &names, Duration::ZERO, 5, Duration::from_secs(20)).await?;
    let stamps = (stamp(&ecds)?, stamp(&cds)?);

    // The sidecar dies: Envoy keeps routing with the table it has.
    c.kill_sidecar()?;
    let killed = load.now();
    successes_after(&load, &names, killed, 10, Duration::from_secs(20)).await?;

    // It comes back: first sync, nothing to write.
    c.start_sidecar().await?;
    let first = c
        .until_sidecar_reports("the restarted sidecar's first sync", Duration::from_secs(10), |r| {
            Some(r.clone())
        })
        .await?;
    assert_eq!(first["changed"], false, "the restarted sidecar rewrote an unchanged table: {first}");
    assert_eq!(first["generation"], generation.as_str());
    assert_eq!((stamp(&ecds)?, stamp(&cds)?), stamps, "ecds.json or cds.json touched");

    // ecds.json corrupted by hand (sidecar stopped, so that only Envoy reacts): Envoy
    // refuses it, twice, and keeps routing with the table it has.
    c.stop_sidecar().await?;
    let envoy = c.envoy()?;
    let rejected = "extension_config_discovery.http_filter.skewgate.update_rejected";
    let unparsable = "extension_config_discovery.http_filter.skewgate.update_failure";
    let accepted = "extension_config_discovery.http_filter.skewgate.update_success";
    let (rejected_before, accepted_before) = (envoy.stat(rejected).await?, envoy.stat(accepted).await?);
    let unparsable_before = envoy.stat(unparsable).await?;
    let good = std::fs::read(&ecds)?;
    // A file Envoy cannot even parse counts as an update failure, not a rejection.
    skewgate_envoy::write_atomic(&ecds, b"{\"resources\": [ this is not JSON")?;
    envoy.wait_stat(unparsable, unparsable_before + 1, Duration::from_secs(10)).await?;
    // Valid JSON, but tables the filter's validation refuses (on_configure → false), one fault
    // each: a schema this build does not read, and a pool cluster that is not one of the
    // clusters the table was sealed with, each refused for its own reason.
    let table_path = "/resources/0/typed_config/config/configuration/value";
    let faults: [(&str, Value, &str); 2] = [
        ("schema", json!(99), "unsupported schema 99"),
        (
            "poolCluster",
            json!("no-such-cluster"),
            "names cluster \"no-such-cluster\", not one of the clusters",
        ),
    ];
    for (i, (field, value, reason)) in faults.into_iter().enumerate() {
        let mut bad: Value = serde_json::from_slice(&good)?;
        let mut table: Value =
            serde_json::from_str(bad.pointer(table_path).and_then(Value::as_str).context("no table")?)?;
        table[field] = value;
        *bad.pointer_mut(table_path).context("no table")? = json!(table.to_string());
        skewgate_envoy::write_atomic(&ecds, bad.to_string().as_bytes())?;
        envoy.wait_stat(rejected, rejected_before + 1 + i as u64, Duration::from_secs(10)).await?;
        until(&format!("Envoy logs why the {field} table was refused"), Duration::from_secs(10), || {
            Ok(envoy.log().contains(reason).then_some(()))
        })
        .await?;
    }
    let corrupted = load.now();
    successes_after(&load, &names, corrupted, 10, Duration::from_secs(20)).await?;
    let live = skewgate::envoy::HttpAdmin::new(&envoy.admin_url(""), Duration::from_secs(5))?;
    use skewgate::envoy::EnvoyAdmin;
    let live_generation = live.live_table().await?.map(|t| t.generation);
    assert_eq!(live_generation.as_deref(), Some(generation.as_str()), "Envoy dropped its table");
    assert_eq!(envoy.stat(accepted).await?, accepted_before);

    // The restarted sidecar puts the file back: its first sync, or its guard (which knows what
    // was last written) if that comes first. The file itself is watched: the report of a
    // repairing sync is replaced by the next (unchanged) one a poll period later.
    let repair = Instant::now();
    c.start_sidecar().await?;
    until("the sidecar rewrites ecds.json as it was", Duration::from_secs(15), || {
        Ok((std::fs::read(&ecds)? == good).then_some(()))
    })
    .await?;
    let repaired_in = repair.elapsed();
    let first_sync = c
        .until_sidecar_reports("the restarted sidecar's first sync", Duration::from_secs(10), |r| {
            Some(r.clone())
        })
        .await?;
    assert_eq!(first_sync["generation"], generation.as_str());
    let metrics = c.sidecar_metrics().await?;
    let pushes = prometheus_value(&metrics, "skewgate_table_pushes_total").unwrap_or(0.0);
    let restores = prometheus_value(&metrics, "skewgate_envoy_restores_total{kind=\"file\"}").unwrap_or(0.0);
    ensure!(pushes + restores >= 1.0, "ecds.json was put back, but not by the restarted sidecar:\n{metrics}");
    c.envoy()?.wait_stat(accepted, accepted_before + 1, Duration::from_secs(10)).await?;
    successes_after(&load, &names, load.now(), 5, Duration::from_secs(20)).await?;
    let report = load.finish().await;
    println!("{}", report.summary());
    let failures = report.failures();
    row.requests += report.records.len();
    row.failures = failures.len();
    ensure!(failures.is_empty(), "{} failed requests:{}", failures.len(), listing(&report, &failures));
    // Rerouted GVRs kept going to their servers throughout.
    for (servers, names) in &by {
        for name in names {
            for r in report.of(name) {
                let who = r.served_by.clone().unwrap_or_default();
                ensure!(servers.contains(&who), "{name} served by {who}");
            }
        }
    }
    println!(
        "sidecar killed at {killed:?}, restarted without a write; ecds.json corrupted twice, refused twice; \
         repaired {repaired_in:?} after the sidecar's restart"
    );
    row.figure(format!(
        "sidecar killed: routing kept, restart wrote nothing (inode+mtime same, changed=false); garbage \
         ecds.json → update_failure +1, invalid table → update_rejected +1, routing kept; sidecar \
         repaired it in {:.1}s",
        repaired_in.as_secs_f64()
    ));
    finish(c, &mut row).await?;
    Ok(row)
}
