//! What the stand-in scenarios share: the eras, starting and finishing a cluster, the ten
//! GVRs of the load loops, and readers of the sidecar's reports and Envoy's stats.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use skewgate::sync::SyncReport;
use skewgate_core::table::RoutingTable;
use skewgate_testkit::cluster::{self, Cluster, Credentials, Options};
use skewgate_testkit::echo::SERVED_BY;
use skewgate_testkit::envoy::Envoy;
use skewgate_testkit::load::{Load, Record, Settings, Target};
use skewgate_testkit::paths;
use skewgate_testkit::scenario::{Row, fresh_dir, header, ids, serving, vm_untroubled};

/// Two apiservers of the 1.33 era and one of the 1.36 era: a rolling upgrade one third done.
pub(crate) const ERAS: &[(&str, &str)] = &[("a", "1.33"), ("b", "1.33"), ("c", "1.36")];
/// Only the 1.36-era apiserver serves it.
pub(crate) const CLAIMS: &str = "resourceclaims.v1.resource.k8s.io";
/// Only the 1.33-era apiservers serve it.
pub(crate) const DEVICECLASSES: &str = "deviceclasses.v1alpha3.resource.k8s.io";
pub(crate) const V2: &str =
    "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json";
pub(crate) const NOPEER: &str =
    "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList;profile=nopeer,application/json";
/// The user extra kube-apiserver's x509 authenticator adds.
pub(crate) const CREDENTIAL_ID: &str = "authentication.kubernetes.io/credential-id";
/// The client's per-request timeout in the load loops.
pub(crate) const TIMEOUT: Duration = Duration::from_secs(10);

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

/// Ten GVRs: three only c serves, three only a and b serve, four everybody serves.
pub(crate) fn ten_targets() -> Vec<Target> {
    vec![
        Target::list("resource.k8s.io", "v1", "resourceclaims", Some("default")),
        Target::list("storage.k8s.io", "v1", "volumeattributesclasses", None),
        Target::list("admissionregistration.k8s.io", "v1", "mutatingadmissionpolicies", None),
        Target::list("resource.k8s.io", "v1alpha3", "deviceclasses", None),
        Target::list("networking.k8s.io", "v1beta1", "ipaddresses", None),
        Target::list("admissionregistration.k8s.io", "v1beta1", "validatingadmissionpolicies", None),
        Target::list("", "v1", "pods", Some("default")),
        Target::list("", "v1", "configmaps", Some("default")),
        Target::list("apps", "v1", "deployments", Some("default")),
        Target::list("", "v1", "namespaces", None),
    ]
}

/// The ten targets' names by who serves them in `table`, checked against the eras' facts.
pub(crate) fn ten_by_servers(table: &RoutingTable) -> Result<BTreeMap<Vec<String>, Vec<String>>> {
    let mut by: BTreeMap<Vec<String>, Vec<String>> = BTreeMap::new();
    for t in ten_targets() {
        by.entry(serving(table, &t.name())).or_default().push(t.name());
    }
    let sizes: Vec<(Vec<String>, usize)> = by.iter().map(|(k, v)| (k.clone(), v.len())).collect();
    ensure!(
        sizes == [(ids(&["a", "b"]), 3), (ids(&["a", "b", "c"]), 4), (ids(&["c"]), 3)],
        "unexpected serving sets for the ten GVRs: {by:?}"
    );
    Ok(by)
}

pub(crate) fn load(c: &Cluster, workers: usize, pause: Duration) -> Result<Load> {
    let client = c.client(Credentials::Alice, TIMEOUT)?;
    Ok(Load::start(&client, &c.envoy_url()?, ten_targets(), Settings { workers, pause, timeout: TIMEOUT }))
}

/// Waits until every one of `names` has `n` answers that started after `after` and match.
pub(crate) async fn answers_after(
    load: &Load,
    names: &[String],
    after: Duration,
    n: usize,
    timeout: Duration,
    matches: impl Fn(&Record) -> bool,
) -> Result<()> {
    load.wait_for(&format!("{n} matching answers each for {names:?}"), timeout, |targets, records| {
        names.iter().all(|name| {
            let index = targets.iter().position(|t| t.name() == *name);
            records.iter().filter(|r| Some(r.target) == index && r.started > after && matches(r)).count() >= n
        })
    })
    .await?;
    Ok(())
}

/// The latest sidecar report.
pub(crate) fn latest_report(c: &Cluster) -> Option<Arc<SyncReport>> {
    c.sidecar.as_ref().and_then(|s| s.reports.borrow().clone())
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
