//! Real clients through skewgate, as a new user runs them during skew: the pinned kubectl (apply,
//! server-side apply, create with default validation, diff, explain of a nested field of a
//! new-API kind), the Python client's DynamicClient and helm (install, upgrade, uninstall), each
//! run with fresh caches so that every run learns the API from scratch.
//!
//! Each loop runs on two clusters: the era stand-ins (1.33, 1.33, 1.36) and the stand-ins
//! serving a real kube-apiserver's captured documents (1.33-real, 1.33-real, 1.36-real).
//! `SKEWGATE_CLIENT_RUNS` sets the run counts: a number (every loop that many runs), `full`
//! (kubectl 50, Python 50, helm 20) or unset (3 each). A loop reports, per operation, its
//! failures and the first failures' stderr with the requests the client made, as Envoy's access
//! log saw them ([`skewgate_harness::clients`]), then fails if any run failed.
//!
//! Needs `make wasm` and `make setup` (Envoy, kubectl, helm and the Python client in .venv):
//! fails, never skips. `make clients` runs it (`make clients-full`: the full counts).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use serde_json::Value;
use skewgate_harness::clients::{self, Loop, failure_detail, run_process};
use skewgate_harness::cluster::Cluster;
use skewgate_harness::kubectl::{Kubectl, Output};
use skewgate_harness::paths;

const ERA: &[(&str, &str)] = &[("a", "1.33"), ("b", "1.33"), ("c", "1.36")];
const REAL: &[(&str, &str)] = &[("a", "1.33-real"), ("b", "1.33-real"), ("c", "1.36-real")];
const NOPEER: &str =
    "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList;profile=nopeer,application/json";
/// One client run's limit: a hung run is a failure, not a hung suite.
const DEADLINE: Duration = Duration::from_secs(90);
const TIMEOUT: Duration = Duration::from_secs(10);

// ---------------------------------------------------------------------------------------------
// Scaffolding

/// Runs per loop: (kubectl, Python, helm).
fn runs() -> Result<(usize, usize, usize)> {
    match std::env::var("SKEWGATE_CLIENT_RUNS").ok().as_deref().map(str::trim) {
        None | Some("") => Ok((3, 3, 3)),
        Some("full") => Ok((50, 50, 20)),
        Some(n) => {
            let n: usize =
                n.parse().with_context(|| format!("SKEWGATE_CLIENT_RUNS={n:?}: a number or full"))?;
            ensure!(n > 0, "SKEWGATE_CLIENT_RUNS=0 would test nothing");
            Ok((n, n, n))
        }
    }
}

/// A cluster of its own under `target/tmp/clients/<name>-<pid>`, kept when the test fails.
/// One cluster at a time: six clusters with Envoy and real clients at once on 2 cores made
/// Envoy refuse connections under `cargo test`'s parallel threads.
static ONE_CLUSTER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn start(name: &str, apiservers: &[(&str, &str)]) -> Result<Cluster> {
    paths::kubectl_binary()?;
    clients::start_edge(Path::new(env!("CARGO_TARGET_TMPDIR")), "clients", name, apiservers).await
}

async fn finish(c: Cluster) -> Result<()> {
    let out = c.out.clone();
    c.shutdown().await?;
    let _ = std::fs::remove_dir_all(out);
    Ok(())
}

/// A fresh, empty directory under the cluster's folder.
fn fresh_dir(c: &Cluster, name: &str) -> Result<PathBuf> {
    let dir = c.out.join("fresh").join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

// ---------------------------------------------------------------------------------------------
// kubectl

fn manifest(name: &str) -> Result<String> {
    let path = paths::workspace_root().join("testdata/clients/dra.yaml");
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    Ok(text.replace("@NAME@", name))
}

/// One kubectl run with its own empty cache directory, as alice through Envoy.
async fn kubectl_fresh(c: &Cluster, cache: &str, args: &[&str], stdin: Option<&str>) -> Result<Output> {
    let dir = fresh_dir(c, cache)?;
    let k = Kubectl::new(&c.kubeconfig, &dir)?;
    let mut command = k.command(args);
    command.env("HOME", &dir);
    let out = run_process(command, stdin, DEADLINE).await;
    let _ = std::fs::remove_dir_all(&dir);
    out
}

async fn kubectl_loop(name: &str, apiservers: &[(&str, &str)]) -> Result<()> {
    let (runs, _, _) = runs()?;
    let c = start(name, apiservers).await?;
    let mut report = Loop::new(format!("kubectl {name}"));
    for run in 0..runs {
        let applied = manifest(&format!("apply-{run}"))?;
        let server_side = manifest(&format!("ssa-{run}"))?;
        let created = manifest(&format!("create-{run}"))?;
        let steps: [(&'static str, Vec<&str>, Option<&str>); 5] = [
            ("apply", vec!["apply", "-f", "-"], Some(&applied)),
            ("diff", vec!["diff", "-f", "-"], Some(&applied)),
            ("apply-server-side", vec!["apply", "--server-side", "-f", "-"], Some(&server_side)),
            ("create", vec!["create", "-f", "-"], Some(&created)),
            (
                "explain",
                vec![
                    "explain",
                    "resourceclaims.spec.devices.requests.exactly",
                    "--api-version=resource.k8s.io/v1",
                ],
                None,
            ),
        ];
        for (op, args, stdin) in steps {
            let label = report.mark(&c, op, run).await?;
            let out = kubectl_fresh(&c, op, &args, stdin).await?;
            let ok = match op {
                // 1: the objects differ from the manifest, which is not an error.
                "diff" => matches!(out.code, Some(0 | 1)),
                "explain" => out.ok && out.stdout.contains("deviceClassName"),
                _ => out.ok,
            };
            report.record(op, &label, out.took, (!ok).then(|| failure_detail(&out)));
        }
        // Not one of the operations under test, but reported: deleting needs discovery too.
        let all = [applied, server_side, created].join("\n---\n");
        let label = report.mark(&c, "delete", run).await?;
        let out = kubectl_fresh(
            &c,
            "delete",
            &["delete", "--ignore-not-found", "--wait=false", "-f", "-"],
            Some(&all),
        )
        .await?;
        report.record("delete", &label, out.took, (!out.ok).then(|| failure_detail(&out)));
    }
    let concluded = report.conclude(&c).await;
    if concluded.is_ok() {
        finish(c).await?;
    }
    concluded
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_era() -> Result<()> {
    let _one = ONE_CLUSTER.lock().await;
    kubectl_loop("era", ERA).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_real() -> Result<()> {
    let _one = ONE_CLUSTER.lock().await;
    kubectl_loop("real", REAL).await
}

// ---------------------------------------------------------------------------------------------
// The Python client

/// Every (group, version, resource, kind) some apiserver serves, from each apiserver's own
/// aggregated discovery, straight from it: what a DynamicClient must find through skewgate.
async fn served_anywhere(c: &Cluster) -> Result<BTreeSet<(String, String, String, String)>> {
    let direct = c.direct_client(TIMEOUT)?;
    let mut union = BTreeSet::new();
    for (id, _) in c.running() {
        let url = c.apiserver_url(&id)?;
        for path in ["/api", "/apis"] {
            let r = direct.get(format!("{url}{path}")).header("accept", NOPEER).send().await?;
            ensure!(r.status() == 200, "{id} {path}: {}", r.status());
            let doc: Value = r.json().await?;
            for group in doc["items"].as_array().into_iter().flatten() {
                let g = group["metadata"]["name"].as_str().unwrap_or_default();
                for version in group["versions"].as_array().into_iter().flatten() {
                    let v = version["version"].as_str().unwrap_or_default();
                    for resource in version["resources"].as_array().into_iter().flatten() {
                        let r = resource["resource"].as_str().unwrap_or_default();
                        let kind = resource["responseKind"]["kind"].as_str().unwrap_or_default();
                        union.insert((g.to_string(), v.to_string(), r.to_string(), kind.to_string()));
                    }
                }
            }
        }
    }
    ensure!(union.iter().any(|(g, v, r, _)| (g.as_str(), v.as_str(), r.as_str()) == ("", "v1", "pods")));
    Ok(union)
}

async fn python_loop(name: &str, apiservers: &[(&str, &str)]) -> Result<()> {
    let (_, runs, _) = runs()?;
    let python = paths::python_with_kubernetes()?;
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients/dynamic_client.py");
    let c = start(name, apiservers).await?;
    let expected = served_anywhere(&c).await?;
    let expected_file = c.out.join("expected-gvrs.json");
    let list: Vec<[&str; 4]> =
        expected.iter().map(|(g, v, r, k)| [g.as_str(), v.as_str(), r.as_str(), k.as_str()]).collect();
    std::fs::write(&expected_file, serde_json::to_vec(&list)?)?;
    let mut report = Loop::new(format!("python {name}"));
    // How often each GVR was missed: the pattern says which documents were not merged.
    let mut missed: BTreeMap<String, usize> = BTreeMap::new();
    for run in 0..runs {
        let label = report.mark(&c, "python", run).await?;
        let dir = fresh_dir(&c, "python")?;
        let mut command = tokio::process::Command::new(&python);
        command
            .arg(&script)
            .arg(&c.kubeconfig)
            .arg("skewgate")
            .arg(dir.join("discovery-cache.json"))
            .arg(&expected_file)
            .env("HOME", &dir);
        let out = run_process(command, None, DEADLINE).await?;
        let _ = std::fs::remove_dir_all(&dir);
        for miss in out.stderr.lines().filter(|l| l.contains("NotFoundError") || l.contains(": kind ")) {
            *missed.entry(miss.split(':').next().unwrap_or(miss).to_string()).or_default() += 1;
        }
        let failure = (!out.ok).then(|| {
            let misses: Vec<&str> = out.stderr.lines().collect();
            format!(
                "exit {:?}; {} ({} lines on stderr):\n  {}",
                out.code,
                out.stdout.trim(),
                misses.len(),
                misses.iter().take(25).copied().collect::<Vec<_>>().join("\n  ")
            )
        });
        report.record("dynamic-client-finds-every-gvr", &label, out.took, failure);
    }
    println!("python {name}: {} GVRs expected (the union of the apiservers' own discovery)", expected.len());
    for (gvr, n) in &missed {
        println!("  missed in {n:>3} of {runs} runs: {gvr}");
    }
    let concluded = report.conclude(&c).await;
    if concluded.is_ok() {
        finish(c).await?;
    }
    concluded
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_era() -> Result<()> {
    let _one = ONE_CLUSTER.lock().await;
    python_loop("era", ERA).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_real() -> Result<()> {
    let _one = ONE_CLUSTER.lock().await;
    python_loop("real", REAL).await
}

// ---------------------------------------------------------------------------------------------
// helm

/// helm with empty caches and configuration (its discovery cache too: `KUBECACHEDIR`), as
/// alice through Envoy.
async fn helm(c: &Cluster, helm: &Path, args: &[&str]) -> Result<Output> {
    let dir = fresh_dir(c, "helm")?;
    let mut command = tokio::process::Command::new(helm);
    command
        .args(args)
        .arg("--kubeconfig")
        .arg(&c.kubeconfig)
        .args(["--kube-context", "skewgate", "--namespace", "default", "--debug"])
        .env("HOME", &dir)
        .env("KUBECACHEDIR", dir.join("kube-cache"))
        .env("HELM_CACHE_HOME", dir.join("cache"))
        .env("HELM_CONFIG_HOME", dir.join("config"))
        .env("HELM_DATA_HOME", dir.join("data"))
        .env_remove("KUBECONFIG");
    let out = run_process(command, None, DEADLINE).await;
    let _ = std::fs::remove_dir_all(&dir);
    out
}

async fn helm_loop(name: &str, apiservers: &[(&str, &str)]) -> Result<()> {
    let (_, _, runs) = runs()?;
    let bin = paths::helm_binary()?;
    let chart = paths::workspace_root().join("testdata/clients/chart");
    let chart = chart.to_str().context("chart path")?.to_string();
    let c = start(name, apiservers).await?;
    let mut report = Loop::new(format!("helm {name}"));
    for run in 0..runs {
        let release = format!("loop-{run}");
        let steps: [(&'static str, Vec<&str>); 3] = [
            ("install", vec!["install", &release, &chart]),
            ("upgrade", vec!["upgrade", &release, &chart, "--set", "message=upgraded"]),
            ("uninstall", vec!["uninstall", &release]),
        ];
        let mut installed = true;
        for (op, args) in steps {
            // Upgrading or uninstalling a release that was never installed tells nothing new
            // (a failed upgrade leaves the release, which uninstall then removes).
            if !installed {
                report.not_reached(op);
                continue;
            }
            let label = report.mark(&c, op, run).await?;
            let out = helm(&c, &bin, &args).await?;
            installed = out.ok || op != "install";
            report.record(op, &label, out.took, (!out.ok).then(|| failure_detail(&out)));
        }
    }
    let concluded = report.conclude(&c).await;
    if concluded.is_ok() {
        finish(c).await?;
    }
    concluded
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_era() -> Result<()> {
    let _one = ONE_CLUSTER.lock().await;
    helm_loop("era", ERA).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_real() -> Result<()> {
    let _one = ONE_CLUSTER.lock().await;
    helm_loop("real", REAL).await
}

// ---------------------------------------------------------------------------------------------
// A restart

/// The only apiserver of resource.k8s.io/v1 (c) stops and comes back 3 s later while kubectl
/// lists its ResourceClaims in a loop: the edge answers 503 meanwhile (Envoy has no healthy
/// host for them), with `Retry-After: 1`, and client-go sends the request again a second later,
/// up to ten times: not one kubectl run fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_rides_out_a_restart_of_the_only_server_of_its_api() -> Result<()> {
    let _one = ONE_CLUSTER.lock().await;
    let mut c = start("restart", ERA).await?;
    let k = Kubectl::new(&c.kubeconfig, &fresh_dir(&c, "restart")?)?;
    let args = ["get", "resourceclaims.v1.resource.k8s.io", "-A"];
    k.ok(&args).await?;
    let unavailable_before = unavailable_replies(&c).await?;
    let looping = clients::Looping::start(&k, &args);
    tokio::time::sleep(Duration::from_secs(2)).await;
    c.stop_apiserver("c").await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    c.start_apiserver("c", "1.36").await?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let runs = looping.stop().await?;
    let answered = unavailable_replies(&c).await? - unavailable_before;
    let slowest = runs.slowest();
    println!(
        "restart of c: {} kubectl runs, {} failed, slowest {:.1}s; the edge answered {answered} × 503 meanwhile",
        runs.0.len(),
        runs.failures().len(),
        slowest.as_secs_f64()
    );
    runs.ensure_none_failed()?;
    ensure!(answered > 0, "the edge answered no 503: the restart was not felt, the test proves nothing");
    ensure!(runs.0.len() >= 10, "only {} runs", runs.0.len());
    finish(c).await
}

/// An upgrade's restart as it happens: c, the only apiserver of resource.k8s.io/v1, gets SIGTERM
/// and serves out a 2 s shutdown delay with its `/readyz` failing (`shutdown`), stops, and is back
/// 3 s later, while kubectl lists its ResourceClaims in a loop. During the delay the edge keeps
/// sending them to c, which still serves them: not one 503 then. Stopped, the 503s carry
/// `Retry-After` and client-go waits it out: not one kubectl run fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_rides_out_a_drain_and_restart_of_the_only_server_of_its_api() -> Result<()> {
    let _one = ONE_CLUSTER.lock().await;
    let mut c = start("drain-restart", ERA).await?;
    let k = Kubectl::new(&c.kubeconfig, &fresh_dir(&c, "drain-restart")?)?;
    let args = ["get", "resourceclaims.v1.resource.k8s.io", "-A"];
    k.ok(&args).await?;
    let looping = clients::Looping::start(&k, &args);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before_drain = unavailable_replies(&c).await?;
    c.standin("c")?.set_ready(false);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let during_drain = unavailable_replies(&c).await? - before_drain;
    c.stop_apiserver("c").await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    c.start_apiserver("c", "1.36").await?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let runs = looping.stop().await?;
    let answered = unavailable_replies(&c).await? - before_drain;
    println!(
        "drain and restart of c: {} kubectl runs, {} failed; the edge answered {during_drain} × 503 during the 2 s drain, {answered} in all",
        runs.0.len(),
        runs.failures().len()
    );
    runs.ensure_none_failed()?;
    ensure!(during_drain == 0, "{during_drain} × 503 while c still served");
    ensure!(answered > 0, "the edge answered no 503: the restart was not felt, the test proves nothing");
    finish(c).await
}

/// 5xx answers at the listener: the edge's own 503s (the stand-ins answer none here).
async fn unavailable_replies(c: &Cluster) -> Result<u64> {
    c.envoy()?.stat("http.apiserver.downstream_rq_5xx").await
}
