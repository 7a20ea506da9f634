//! Scenario 4: Watch.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::Result;
use skewgate_harness::cluster::{Cluster, Credentials};
use skewgate_harness::scenario::{Row, kubectl, scenario, until};

use crate::common::watch::{Watch, same_events, write_claims};
use crate::support::{CLAIMS, ERAS, TIMEOUT, finish, start};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s04_watch() -> Result<()> {
    scenario("04", "watch 90 s", watch()).await
}

async fn watch() -> Result<Row> {
    let mut row = Row::default();
    let c = start("s04", ERAS, |_| {}).await?;
    let k = kubectl(&c)?;
    k.ok(&["create", "namespace", "e2e-watch"]).await?;
    row.requests += 1;
    let watch = Watch::start(&k, &c, "e2e-watch")?;
    let watches = |c: &Cluster| -> BTreeMap<String, u64> {
        c.standins
            .iter()
            .map(|s| (s.id.clone(), s.watch_requests().get(CLAIMS).copied().unwrap_or(0)))
            .collect()
    };
    until("kubectl's watch reaches an apiserver", Duration::from_secs(15), || {
        Ok((watches(&c).values().sum::<u64>() == 1).then_some(()))
    })
    .await?;
    let opened = Instant::now();

    // One write a second for 90 s through Envoy: create, patch, delete, create, ...
    let alice = c.client(Credentials::Alice, TIMEOUT)?;
    let base = format!("{}/apis/resource.k8s.io/v1/namespaces/e2e-watch/resourceclaims", c.envoy_url()?);
    let written = write_claims(&alice, &base, Duration::from_secs(90)).await?;
    row.requests += written.len();

    let received = watch.stop_after(&written)?;
    let open_for = opened.elapsed();
    same_events(&written, &received)?;
    let watch_requests = watches(&c);
    println!(
        "watch open {open_for:.1?}: {} events written, {} received; watch requests per apiserver \
         {watch_requests:?}",
        written.len(),
        received.len()
    );
    assert_eq!(
        watch_requests,
        BTreeMap::from([("a".into(), 0), ("b".into(), 0), ("c".into(), 1)]),
        "reconnects"
    );
    row.figure(format!(
        "open {:.0}s, {} events written, {} received, watch requests {watch_requests:?}",
        open_for.as_secs_f64(),
        written.len(),
        received.len()
    ));
    finish(c, &mut row).await?;
    Ok(row)
}
