//! What the stand-in scenarios share: the eras, starting and finishing a cluster, and readers
//! of the sidecar's reports and Envoy's stats (the steps they share with the real-apiserver
//! scenarios are in `common`).

use std::path::Path;

use anyhow::{Context, Result, ensure};
use skewgate_harness::cluster::{self, Cluster, Options};
use skewgate_harness::echo::SERVED_BY;
use skewgate_harness::envoy::Envoy;
use skewgate_harness::paths;
use skewgate_harness::scenario::{Row, fresh_dir, header, vm_untroubled};

use crate::common::Suite;
pub(crate) use crate::common::{CLAIMS, CREDENTIAL_ID, TIMEOUT, V2, answers_after};

/// Two apiservers of the 1.33 era and one of the 1.36 era: a rolling upgrade one third done.
pub(crate) const ERAS: &[(&str, &str)] = &[("a", "1.33"), ("b", "1.33"), ("c", "1.36")];
/// Only the 1.33-era apiservers serve it.
pub(crate) const DEVICECLASSES: &str = "deviceclasses.v1alpha3.resource.k8s.io";
pub(crate) const SUITE: Suite = Suite { old_classes: "v1alpha3", new_profile: "1.36", names_itself: true };

/// A cluster of its own under `target/tmp/e2e/<name>-<pid>` (two runs of the suite at once must
/// not share certificates or Envoy's files).
pub(crate) async fn start(
    name: &str,
    apiservers: &[(&str, &str)],
    tweak: impl FnOnce(&mut Options),
) -> Result<Cluster> {
    // Missing parts fail the suite here, with the command that installs them.
    paths::envoy_binary()?;
    paths::kubectl_binary()?;
    paths::filter_wasm()?;
    let out = fresh_dir(Path::new(env!("CARGO_TARGET_TMPDIR")), "e2e", name);
    let mut options = Options::ephemeral(&out, apiservers);
    tweak(&mut options);
    cluster::start(&options).await.with_context(|| format!("starting cluster {name}"))
}

/// The checks every scenario ends with: nothing reached a stand-in in plaintext, the filter's
/// VM never trapped; then the cluster stops and its files go (a failed scenario keeps them).
pub(crate) async fn finish(c: Cluster, row: &mut Row) -> Result<()> {
    let plaintext = c.plaintext_attempts();
    ensure!(plaintext == 0, "{plaintext} plaintext connections reached a stand-in");
    vm_untroubled(c.envoy()?).await?;
    row.figure(format!("plaintext {plaintext}"));
    let out = c.out.clone();
    c.shutdown().await?;
    let _ = std::fs::remove_dir_all(out);
    Ok(())
}

pub(crate) fn prometheus_value(text: &str, name_and_labels: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(name_and_labels)?.strip_prefix(' ')?.parse().ok())
}

pub(crate) async fn rerouted_count(envoy: &Envoy, group: &str, version: &str, resource: &str) -> Result<u64> {
    let name = format!(
        "wasmcustom.skewgate.rerouted_requests_total.group={group};version={version};resource={resource};"
    );
    envoy.stat(&name).await
}

/// Which stand-in served a response, and what it recorded of the request.
pub(crate) fn served(c: &Cluster, h: &reqwest::header::HeaderMap) -> Result<skewgate_standin::Served> {
    let by = header(h, SERVED_BY).context("no x-skewgate-served-by: not an apiserver's answer")?;
    let audit = header(h, "audit-id").context("no Audit-Id")?;
    c.standin(&by)?.served(&audit).with_context(|| format!("{by} does not remember {audit}"))
}
