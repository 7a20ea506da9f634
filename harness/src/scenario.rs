//! What the end-to-end suites share (e2e/tests/e2e/, e2e_peers.rs, e2e_real.rs): the summary
//! row every scenario prints and `scripts/e2e-summary.sh` reads, a fresh folder per cluster,
//! polling with a deadline, the checks every scenario ends with, and small readers of tables,
//! headers, load reports and certificates.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use sha2::Digest;
use skewgate_core::table::RoutingTable;

use crate::cluster::Cluster;
use crate::envoy::Envoy;
use crate::kubectl::Kubectl;
use crate::load::{Load, Record, Report, Target};

/// What a scenario reports in the summary.
#[derive(Debug, Default)]
pub struct Row {
    /// Requests the scenario made (kubectl runs count one each, a load loop its records).
    pub requests: usize,
    /// Requests whose outcome was not the expected one (expected 503s are not failures).
    pub failures: usize,
    pub figures: Vec<String>,
}

impl Row {
    pub fn figure(&mut self, text: impl Into<String>) {
        self.figures.push(text.into());
    }
}

/// Runs one scenario and records its row (pass or fail) for the summary table: printed as an
/// `E2E-ROW` line and, when `SKEWGATE_E2E_SUMMARY` names a directory (`make e2e` does), written
/// there as `<id>.tsv`.
pub async fn scenario(id: &str, title: &str, body: impl Future<Output = Result<Row>>) -> Result<()> {
    let started = Instant::now();
    let result = body.await;
    let wall = started.elapsed();
    let (verdict, requests, failures, figures) = match &result {
        Ok(row) => ("pass", row.requests.to_string(), row.failures.to_string(), row.figures.join("; ")),
        Err(e) => ("FAIL", "-".into(), "-".into(), format!("{e:#}").lines().next().unwrap_or("").to_string()),
    };
    let line =
        format!("{id}\t{title}\t{verdict}\t{requests}\t{failures}\t{:.1}s\t{figures}", wall.as_secs_f64());
    println!("E2E-ROW\t{line}");
    if let Some(dir) = std::env::var_os("SKEWGATE_E2E_SUMMARY").map(PathBuf::from) {
        std::fs::create_dir_all(&dir)?;
        std::fs::write(dir.join(format!("{id}.tsv")), format!("{line}\n"))?;
    }
    result.map(|_| ())
}

/// `<tmp>/<suite>/<name>-<pid>`, emptied: two runs of a suite at once must not share
/// certificates or Envoy's files.
pub fn fresh_dir(tmp: &Path, suite: &str, name: &str) -> PathBuf {
    let out = tmp.join(suite).join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    out
}

/// Polls `check` every 20 ms until it yields, or fails after `timeout`.
pub async fn until<T>(
    what: &str,
    timeout: Duration,
    mut check: impl FnMut() -> Result<Option<T>>,
) -> Result<T> {
    let started = Instant::now();
    loop {
        if let Some(value) = check()? {
            return Ok(value);
        }
        if started.elapsed() > timeout {
            bail!("{what}: not within {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// No wasm VM failed, was reloaded or crashed.
pub async fn vm_untroubled(envoy: &Envoy) -> Result<()> {
    let stats = envoy.stats().await?;
    let trouble: Vec<_> = stats
        .iter()
        .filter(|(k, v)| {
            k.starts_with("wasm.")
                && ["fail", "reload", "crash", "restart"].iter().any(|w| k.contains(w))
                && **v > 0
        })
        .collect();
    ensure!(trouble.is_empty(), "wasm VM trouble: {trouble:?}");
    Ok(())
}

/// kubectl with the cluster's kubeconfig and a cache of its own.
pub fn kubectl(c: &Cluster) -> Result<Kubectl> {
    Kubectl::new(&c.kubeconfig, &c.out.join("kube-cache"))
}

/// Who serves a GVR (`resource.version.group`) in `table`.
pub fn serving(table: &RoutingTable, gvr: &str) -> Vec<String> {
    let (resource, rest) = gvr.split_once('.').unwrap_or((gvr, ""));
    let (version, group) = rest.split_once('.').unwrap_or((rest, ""));
    match table.gvr(group, version, resource) {
        Some(g) => table.members(g.serving).map(str::to_owned).collect(),
        None => Vec::new(),
    }
}

pub fn ids(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

pub fn header(h: &reqwest::header::HeaderMap, name: &str) -> Option<String> {
    h.get(name).and_then(|v| v.to_str().ok()).map(str::to_owned)
}

/// The first ten of `records`, one per line, for an error message.
pub fn listing(report: &Report, records: &[&Record]) -> String {
    records.iter().take(10).map(|r| format!("\n  {}", r.describe(&report.targets))).collect()
}

/// Waits until every one of `names` has `n` successes that started after `after`.
pub async fn successes_after(
    load: &Load,
    names: &[String],
    after: Duration,
    n: usize,
    timeout: Duration,
) -> Result<()> {
    let what = format!("{n} successes each for {names:?} after {after:?}");
    load.wait_for(&what, timeout, |targets, records| {
        names.iter().all(|name| {
            let index = targets.iter().position(|t| t.name() == *name);
            records.iter().filter(|r| Some(r.target) == index && r.ok() && r.started > after).count() >= n
        })
    })
    .await?;
    Ok(())
}

/// Lower-case hex SHA-256 of the (first) certificate in a PEM file: what kube-apiserver's x509
/// authenticator puts in the credential id.
pub fn cert_sha256(pem: &Path) -> Result<String> {
    let der = skewgate_pki::load_certs(pem)?.into_iter().next().context("no certificate")?;
    Ok(sha2::Sha256::digest(der.as_ref()).iter().map(|b| format!("{b:02x}")).collect())
}

/// A child process that does not outlive a failed test.
pub struct KillOnDrop(pub std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Row {
    /// Counts a load loop's records and the unexpected ones among them; fails when there are any.
    pub fn tally(&mut self, report: &Report, unexpected: &[&Record], what: &str) -> Result<()> {
        self.requests += report.records.len();
        self.failures = unexpected.len();
        ensure!(
            unexpected.is_empty(),
            "{} unexpected {what}:{}",
            unexpected.len(),
            listing(report, unexpected)
        );
        Ok(())
    }
}

/// The ten GVRs of the end-to-end load loops on a cluster of the 1.33 and 1.36 eras: three only
/// the 1.36 era serves, three only the 1.33 era serves (`old_classes` is the version of
/// resource.k8s.io's deviceclasses it has: v1alpha3 on the stand-ins, v1beta1 on a real 1.33
/// with beta APIs on), four everybody serves.
pub fn ten_targets(old_classes: &str) -> Vec<Target> {
    vec![
        Target::list("resource.k8s.io", "v1", "resourceclaims", Some("default")),
        Target::list("storage.k8s.io", "v1", "volumeattributesclasses", None),
        Target::list("admissionregistration.k8s.io", "v1", "mutatingadmissionpolicies", None),
        Target::list("resource.k8s.io", old_classes, "deviceclasses", None),
        Target::list("networking.k8s.io", "v1beta1", "ipaddresses", None),
        Target::list("admissionregistration.k8s.io", "v1beta1", "validatingadmissionpolicies", None),
        Target::list("", "v1", "pods", Some("default")),
        Target::list("", "v1", "configmaps", Some("default")),
        Target::list("apps", "v1", "deployments", Some("default")),
        Target::list("", "v1", "namespaces", None),
    ]
}

/// A `resource.k8s.io/v1` ResourceClaim asking for one device of `class`.
pub fn claim_yaml(name: &str, namespace: &str, class: &str) -> String {
    format!(
        "apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata:
  name: {name}
  namespace: {namespace}
spec:
  devices:
    requests:
    - name: gpu
      exactly:
        deviceClassName: {class}
"
    )
}

/// A PersistentVolumeClaim of 1Gi, with `class` as its volume attributes class
/// (`spec.volumeAttributesClassName`, a field 1.33's defaults drop) if given.
pub fn volume_claim(name: &str, class: Option<&str>) -> serde_json::Value {
    let mut spec =
        serde_json::json!({"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}});
    if let Some(class) = class {
        spec["volumeAttributesClassName"] = class.into();
    }
    serde_json::json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name}, "spec": spec})
}

/// The `n`th patch that sets a claim's volume attributes class to `silver`: a merge patch, then a
/// JSON patch, in turn. Its content type and body.
pub fn class_patch(n: usize) -> (&'static str, &'static str) {
    match n % 2 {
        0 => ("application/merge-patch+json", r#"{"spec":{"volumeAttributesClassName":"silver"}}"#),
        _ => (
            "application/json-patch+json",
            r#"[{"op":"add","path":"/spec/volumeAttributesClassName","value":"silver"}]"#,
        ),
    }
}

/// A DeviceClass of `api_version` selecting the devices of driver gpu.example.com.
pub fn device_class_yaml(api_version: &str, name: &str) -> String {
    format!(
        "apiVersion: {api_version}
kind: DeviceClass
metadata:
  name: {name}
spec:
  selectors:
  - cel:
      expression: 'device.driver == \"gpu.example.com\"'
"
    )
}
