//! The launcher (`skewgate-harness cluster`, under `make demo`) over the directory of an earlier
//! run: the Envoy files left there describe another cluster.

use anyhow::{Context, Result};
use skewgate_harness::cluster;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_cluster_starts_in_the_same_directory() -> Result<()> {
    let out = std::env::temp_dir().join(format!("skewgate-launcher-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let options = cluster::Options::ephemeral(&out, &[("a", "1.33"), ("b", "1.33"), ("c", "1.36")]);
    for run in 1..=2 {
        let c = cluster::start(&options).await.with_context(|| format!("run {run} in {}", out.display()))?;
        c.shutdown().await?;
    }
    std::fs::remove_dir_all(&out)?;
    Ok(())
}
