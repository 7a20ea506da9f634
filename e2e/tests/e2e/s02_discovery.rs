//! Scenario 2: Discovery.

use anyhow::Result;
use skewgate_harness::scenario::{Row, scenario};

use crate::support::{ERAS, SUITE, finish, start};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s02_discovery() -> Result<()> {
    scenario("02", "discovery", discovery()).await
}

async fn discovery() -> Result<Row> {
    let mut row = Row::default();
    let c = start("s02", ERAS, |_| {}).await?;
    let era_only = [
        "resource.k8s.io/v1",
        "resource.k8s.io/v1alpha3",
        "networking.k8s.io/v1beta1",
        "storage.k8s.io/v1alpha1",
    ];
    SUITE.discovery(&c, &mut row, &era_only).await?;
    finish(c, &mut row).await?;
    Ok(row)
}
